//! A tensor store that also shows each expert of a 3-D expert tensor as its own matrix:
//! llama.cpp's GGUF stacks a mixture-of-experts layer's experts into one tensor per projection
//! (`blk.N.ffn_gate_exps.weight`, `[experts, rows, cols]` outermost first), and each expert's rows
//! are contiguous in it, so expert `e` is the byte range `e · rows · row_bytes ..` — no copy. The
//! slice is named `<tensor>#<e>` ([`expert_slice_name`]); everything else passes through. A 2-D
//! tensor that fuses equal row blocks (Phi-3's gate ‖ up) can be split the same way
//! ([`ExpertSlices::with_row_splits`]).

use std::collections::HashMap;
use std::sync::Arc;

use anelm_model::error::ModelError;
use anelm_model::tensor_store::{TensorStore, TensorView};

/// The name of expert `expert`'s slice of the 3-D tensor `tensor`.
pub fn expert_slice_name(tensor: &str, expert: usize) -> String {
    format!("{tensor}#{expert}")
}

/// `inner`'s tensors, plus every expert slice of its 3-D tensors.
pub struct ExpertSlices {
    inner: Arc<dyn TensorStore>,
    /// Every name: the inner ones, then the slices.
    names: Vec<String>,
    /// Slice name → (index of its name in `names`, the 3-D tensor's name, expert).
    slices: HashMap<String, (usize, String, usize)>,
    /// 2-D tensors read as `parts` equal row blocks.
    row_splits: HashMap<String, usize>,
}

impl ExpertSlices {
    /// `inner` seen through an `ExpertSlices` when it has 3-D tensors, else `inner` itself.
    pub fn over(inner: Arc<dyn TensorStore>) -> Arc<dyn TensorStore> {
        let stacked = (inner.tensor_names().iter()).any(|&n| inner.tensor(n).is_ok_and(|v| v.shape.len() == 3));
        if stacked { Arc::new(Self::new(inner)) } else { inner }
    }

    /// Wrap `inner`, naming a slice for each expert of each 3-D tensor.
    pub fn new(inner: Arc<dyn TensorStore>) -> Self {
        let mut names: Vec<String> = inner.tensor_names().iter().map(|n| n.to_string()).collect();
        let mut slices = HashMap::new();
        let stacked: Vec<(String, usize)> = (inner.tensor_names().iter())
            .filter_map(|&n| {
                let v = inner.tensor(n).ok()?;
                (v.shape.len() == 3).then(|| (n.to_string(), v.shape[0]))
            })
            .collect();
        for (tensor, experts) in stacked {
            for e in 0..experts {
                let name = expert_slice_name(&tensor, e);
                slices.insert(name.clone(), (names.len(), tensor.clone(), e));
                names.push(name);
            }
        }
        Self {
            inner,
            names,
            slices,
            row_splits: HashMap::new(),
        }
    }

    /// [`ExpertSlices::new`], and each 2-D tensor of `tensors` read as `parts` equal blocks of
    /// rows, block `k` named `<tensor>#<k>`.
    pub fn with_row_splits(inner: Arc<dyn TensorStore>, tensors: &[String], parts: usize) -> Self {
        let mut s = Self::new(inner);
        for t in tensors {
            for k in 0..parts {
                let name = expert_slice_name(t, k);
                s.slices.insert(name.clone(), (s.names.len(), t.clone(), k));
                s.names.push(name);
            }
            s.row_splits.insert(t.clone(), parts);
        }
        s
    }
}

impl TensorStore for ExpertSlices {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
        let Some((index, tensor, e)) = self.slices.get(name) else {
            return self.inner.tensor(name);
        };
        let whole = self.inner.tensor(tensor)?;
        let bad = |why: &str| ModelError::Invalid {
            file: format!("expert tensor `{tensor}`"),
            what: why.to_string(),
        };
        let (experts, rows, cols) = match (&whole.shape[..], self.row_splits.get(tensor)) {
            (&[experts, rows, cols], _) => (experts, rows, cols),
            (&[rows, cols], Some(&parts)) if parts > 0 && rows % parts == 0 => (parts, rows / parts, cols),
            _ => return Err(bad("not 3-D, nor a 2-D tensor of equal row blocks")),
        };
        let per_expert = whole
            .format
            .row_bytes(cols)
            .ok()
            .and_then(|rb| rb.checked_mul(rows))
            .ok_or_else(|| bad("its rows are not whole blocks"))?;
        if *e >= experts || per_expert.checked_mul(experts) != Some(whole.data.len()) {
            return Err(bad("its size does not match its shape"));
        }
        Ok(TensorView {
            name: self.names[*index].as_str(),
            format: whole.format,
            shape: vec![rows, cols],
            data: &whole.data[e * per_expert..(e + 1) * per_expert],
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.slices.contains_key(name) || self.inner.contains(name)
    }

    fn tensor_names(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    fn release(&self, bytes: &[u8]) {
        self.inner.release(bytes);
    }

    fn read_into(&self, bytes: &[u8], out: &mut [u8]) {
        self.inner.read_into(bytes, out);
    }
}
