//! The tensors every decoder loads the same way around its layers: the token embedding (kept
//! in its stored format, rows decoded per token) and norm vectors. (The LM head is the last
//! kernel of the architecture's [`crate::arch::kernel_list::KernelList`].)

use std::sync::Arc;

use anelm_model::tensor_store::TensorStore;

use crate::arch::tensor_names::{Tensor, TensorNames};
use crate::error::Result;
use crate::stored_matrix::StoredMatrix;

/// The `vocab × hidden` token embedding, its shape checked.
pub(crate) fn load_embedding(
    store: &Arc<dyn TensorStore>,
    names: &TensorNames,
    vocab: usize,
    hidden: usize,
) -> Result<StoredMatrix> {
    let embed = StoredMatrix::load(store, &names.name(Tensor::TokenEmbedding)?)?;
    embed.expect_shape(vocab, hidden)?;
    Ok(embed)
}

/// A `rows × cols` matrix (a vector: one row) decoded to f32, its shape checked: the small
/// tensors the host computes with (norms, heads, routers).
pub(crate) fn f32_matrix(store: &Arc<dyn TensorStore>, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>> {
    let m = StoredMatrix::load(store, name)?;
    m.expect_shape(rows, cols)?;
    m.to_f32()
}

/// A norm weight of `len` values in f32, plus `offset` (1 for files storing `(1 + w)` norms as
/// `w`, else 0).
pub(crate) fn norm_vector(store: &Arc<dyn TensorStore>, name: &str, len: usize, offset: f32) -> Result<Vec<f32>> {
    let mut v = f32_matrix(store, name, 1, len)?;
    if offset != 0.0 {
        v.iter_mut().for_each(|w| *w += offset);
    }
    Ok(v)
}

/// Decode a small tensor of any rank to f32 (conv weights are `[channels, 1, taps]`), checking
/// it holds `len` values.
pub(crate) fn small_tensor(store: &dyn TensorStore, name: &str, len: usize) -> Result<Vec<f32>> {
    let view = store.tensor(name)?;
    if view.n_elements() != len {
        return Err(crate::error::EngineError::TensorShape {
            name: name.to_string(),
            found: view.shape.clone(),
            expected: vec![len],
        });
    }
    let mut out = vec![0.0; len];
    anelm_kernels::dequantize_row(view.format, view.data, &mut out)?;
    Ok(out)
}
