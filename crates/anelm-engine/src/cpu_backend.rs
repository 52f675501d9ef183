//! The CPU backend: kernels run natively on the weights in their stored format (no f32
//! expansion), with the activation quantised to the weight format's dot format.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Instant;

use anelm_kernels::{Activations, Bf16Activations, Bf16Matrix, ComputeUnit, WeightFormat};
use anelm_model::tensor_store::TensorStore;

use crate::backend::{Backend, Dispatch, Kernel, KernelShape, KernelSpec};
use crate::batch::Batch;
use crate::error::{EngineError, Result, check_matrix_shape};
use crate::load_quantize::{LoadQuantization, quantize_matrix, quantize_packed, target_format};
use crate::stored_matrix::StoredMatrix;

/// Runs `KernelSpec`s on the host CPU through `anelm-kernels` (threads: the kernel pool).
#[derive(Clone, Debug)]
pub struct CpuBackend {
    /// Which float matrices run as bf16 × bf16.
    bf16: Bf16Policy,
    /// Re-encode float matrices at load (see [`CpuBackend::quantizing`]).
    quantize: Option<LoadQuantization>,
}

/// Which float matrices a [`CpuBackend`] multiplies as bf16 × bf16 (`vdpbf16ps`, f32 sums).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Bf16Policy {
    /// None: every float matrix with f32 activations.
    #[default]
    Off,
    /// Matrices stored as bf16: their weights are bf16 already, and the activations are rounded
    /// to bf16 as llama.cpp's BF16 dot and a bf16 transformers model round them.
    StoredBf16,
    /// Every f32, f16 or bf16 matrix, rounded to bf16 at load (embedding models).
    AllFloats,
}

impl Bf16Policy {
    /// `policy` where this CPU has AVX512_BF16 and `ANELM_BF16` is not 0, else `Off`.
    fn where_available(policy: Bf16Policy) -> Bf16Policy {
        if Bf16Matrix::available() && anelm_kernels::Tuning::get().bf16 {
            policy
        } else {
            Bf16Policy::Off
        }
    }

    /// Whether a matrix stored as `format` runs as bf16.
    fn covers(self, format: WeightFormat) -> bool {
        match self {
            Bf16Policy::Off => false,
            Bf16Policy::StoredBf16 => format == WeightFormat::BF16,
            Bf16Policy::AllFloats => matches!(format, WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16),
        }
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// The CPU backend: every matrix in its stored format, activations in that format's dot
    /// format (what the decoders are checked against llama.cpp and transformers with). Matrices
    /// stored as bf16 (Hugging Face bf16 checkpoints, BF16 GGUFs) run as bf16 × bf16 with f32
    /// sums where the CPU has AVX512_BF16 — the activations rounded to bf16, as llama.cpp's BF16
    /// dot rounds them — at twice the multiply rate of the f32 tile; `ANELM_BF16=0` keeps f32
    /// activations.
    pub fn new() -> Self {
        Self {
            bf16: Bf16Policy::where_available(Bf16Policy::StoredBf16),
            quantize: None,
        }
    }

    /// The CPU backend for embedding models: where the CPU has AVX512_BF16, matrices stored as
    /// f32, f16 or bf16 are rounded to bf16 once at load and multiplied with bf16-rounded
    /// activations (`vdpbf16ps`, f32 sums; twice the multiply rate of the f32 tile). An encoder's
    /// packed texts are bound by that rate; its embeddings stay within the fixture's cosine
    /// bound (`tests/minilm.rs`). Elsewhere, or with `ANELM_BF16=0` (for A/B runs), the same as
    /// [`CpuBackend::new`].
    pub fn for_embeddings() -> Self {
        Self {
            bf16: Bf16Policy::where_available(Bf16Policy::AllFloats),
            quantize: None,
        }
    }

    /// The CPU backend, re-encoding float (f32/f16/bf16) matrices to `q` as it compiles them
    /// (`--quantize`; see [`crate::load_quantize`]).
    pub fn quantizing(q: LoadQuantization) -> Self {
        Self {
            bf16: Bf16Policy::Off,
            quantize: Some(q),
        }
    }

    /// Whether this backend runs every float matrix (f32, f16, bf16) as bf16
    /// ([`CpuBackend::for_embeddings`] on a CPU with AVX512_BF16).
    pub fn bf16(&self) -> bool {
        self.bf16 == Bf16Policy::AllFloats
    }
}

/// Lanes per CPU dispatch: large, so a whole prefill chunk shares each weight read.
const CPU_MAX_LANES: usize = 512;

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn max_lanes(&self) -> usize {
        CPU_MAX_LANES
    }

    fn compile(&self, spec: &KernelSpec, weights: &Arc<dyn TensorStore>) -> Result<Box<dyn Kernel>> {
        let load = |id: &crate::backend::WeightId| {
            let m = StoredMatrix::load(weights, &id.0)?;
            match self.quantize {
                Some(q) => CpuMatrix::quantized(m, q),
                None => {
                    let bf16 = self.bf16.covers(m.format);
                    CpuMatrix::new(m, bf16)
                }
            }
        };
        match spec {
            KernelSpec::Linear { w } | KernelSpec::LmHead { w } => Ok(Box::new(CpuLinear::new(vec![load(w)?], false)?)),
            KernelSpec::LinearResidual { w } => Ok(Box::new(CpuLinear::new(vec![load(w)?], true)?)),
            KernelSpec::Concat { ws } => {
                let mats = ws.iter().map(load).collect::<Result<Vec<_>>>()?;
                Ok(Box::new(CpuLinear::new(mats, false)?))
            }
            KernelSpec::SwiGluResidual { gate, up, down } | KernelSpec::SwiGluAccumulate { gate, up, down } => {
                Ok(Box::new(CpuSwiGlu::new(load(gate)?, load(up)?, load(down)?)?))
            }
        }
    }
}

fn check_inputs<'a>(
    inputs: &[&'a Batch],
    shape: KernelShape,
    residual: bool,
) -> Result<(&'a Batch, Option<&'a Batch>)> {
    let bad = |m: String| EngineError::Backend {
        backend: "cpu".into(),
        message: m,
    };
    let x = *inputs
        .first()
        .ok_or_else(|| bad("kernel run without an input".into()))?;
    if x.channels() != shape.input {
        return Err(bad(format!(
            "input has {} channels, kernel takes {}",
            x.channels(),
            shape.input
        )));
    }
    let r = if residual {
        let r = *inputs
            .get(1)
            .ok_or_else(|| bad("residual kernel run without r".into()))?;
        if r.channels() != shape.output || r.lanes() != x.lanes() {
            return Err(bad(format!(
                "residual is {}×{}, expected {}×{}",
                r.lanes(),
                r.channels(),
                x.lanes(),
                shape.output
            )));
        }
        Some(r)
    } else {
        None
    };
    Ok((x, r))
}

/// A stored matrix plus, where this CPU has a kernel for it, the same weights in the
/// interleaved layout of `anelm_kernels::PackedMatrix` (8 rows per block group: a third of the
/// per-block work of the row-major tile for one lane, half for four). The packed copy replaces
/// the mapped bytes for compute; they are released back to the page cache (see
/// `StoredMatrix::release_pages`), so memory stays at one copy.
struct CpuMatrix {
    /// Tensor name in the store.
    name: String,
    /// The format the kernels read (the quantised one for a matrix quantised at load).
    format: WeightFormat,
    /// Output channels.
    rows: usize,
    /// Input channels.
    cols: usize,
    /// Bytes of the weights in `format`, as a step streams them.
    weight_bytes: usize,
    /// The row-major weights; `None` for a matrix quantised at load straight into `packed`.
    stored: Option<StoredMatrix>,
    packed: Option<anelm_kernels::PackedMatrix>,
    /// The weights as bf16, where the backend's [`Bf16Policy`] covers the matrix.
    bf16: Option<Bf16Matrix>,
}

impl CpuMatrix {
    fn new(m: StoredMatrix, bf16: bool) -> Result<Self> {
        if bf16 && matches!(m.format, WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16) {
            // `to_f32` gives the mapped pages back: the bf16 copy is the one kept.
            let b = Bf16Matrix::from_f32(&m.to_f32()?, m.rows, m.cols)?;
            return Ok(Self::with(m, None, Some(b)));
        }
        let packed = anelm_kernels::PackedMatrix::pack_releasing(m.format, m.bytes(), m.rows, m.cols, &mut |done| {
            m.release_pages(done)
        })?;
        Ok(Self::with(m, packed, None))
    }

    fn with(m: StoredMatrix, packed: Option<anelm_kernels::PackedMatrix>, bf16: Option<Bf16Matrix>) -> Self {
        Self {
            name: m.name.clone(),
            format: m.format,
            rows: m.rows,
            cols: m.cols,
            weight_bytes: m.bytes().len(),
            stored: Some(m),
            packed,
            bf16,
        }
    }

    /// `m` re-encoded to `q` at load (see [`crate::load_quantize`]): straight into the packed
    /// layout where this CPU has a kernel for it (the row-major quantised matrix never exists
    /// whole), else row-major; either way the float pages are given back as rows are done.
    fn quantized(m: StoredMatrix, q: LoadQuantization) -> Result<Self> {
        let Some(target) = target_format(&m, q) else {
            return Self::new(m, false);
        };
        if let Some(packed) = quantize_packed(&m, target)? {
            let weight_bytes = target.row_bytes(m.cols)? * m.rows;
            return Ok(Self {
                name: m.name.clone(),
                format: target,
                rows: m.rows,
                cols: m.cols,
                weight_bytes,
                stored: None,
                packed: Some(packed),
                bf16: None,
            });
        }
        Self::new(quantize_matrix(m, q)?, false)
    }

    /// The CPU unit this matrix's matmuls run on.
    fn unit(&self) -> ComputeUnit {
        if self.bf16.is_some() {
            ComputeUnit::Bf16Dot
        } else {
            ComputeUnit::for_format(self.format, false)
        }
    }

    /// Multiply-accumulates of one lane.
    fn macs(&self) -> u64 {
        (self.rows * self.cols) as u64
    }

    /// Require a shape, naming the tensor when it differs.
    fn expect_shape(&self, rows: usize, cols: usize) -> Result<()> {
        check_matrix_shape(&self.name, (self.rows, self.cols), (rows, cols))
    }

    fn matmul(&self, act: &Activations, out: &mut [f32]) -> Result<()> {
        match (&self.packed, &self.stored) {
            (Some(p), _) => p.matmul(act, out)?,
            (None, Some(m)) => anelm_kernels::matmul(m.format, m.bytes(), m.rows, m.cols, act, out)?,
            (None, None) => {
                return Err(EngineError::Config(format!(
                    "tensor '{}' has neither packed nor stored weights",
                    self.name
                )));
            }
        }
        Ok(())
    }
}

/// Scratch buffers of the kernel runs on one thread, reused so the steady state does not
/// allocate. One set per thread, not per kernel: kernels run one after another, and a set per
/// kernel held `lanes × ffn` floats twice for every layer (108 MB for SmolLM2 at 132-token
/// serving steps, kept for the life of the process).
#[derive(Default)]
struct Scratch {
    act: Activations,
    /// The input rounded to bf16, for bf16 matrices.
    act_bf16: Bf16Activations,
    /// The down projection's input, quantised by the gate/up tasks.
    act_down: Activations,
    part: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Run `f` with this thread's scratch (kernels do not nest, so the borrow is never contended).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|s| f(&mut s.borrow_mut()))
}

/// `Linear`, `LinearResidual` and `Concat`.
struct CpuLinear {
    mats: Vec<CpuMatrix>,
    residual: bool,
    shape: KernelShape,
    /// Multiply-accumulates per lane of all its matrices.
    macs: u64,
    /// The unit of its largest matrix.
    unit: Option<ComputeUnit>,
}

impl CpuLinear {
    fn new(mats: Vec<CpuMatrix>, residual: bool) -> Result<Self> {
        let first = mats
            .first()
            .ok_or_else(|| EngineError::Config("a Concat kernel needs at least one matrix".into()))?;
        let input = first.cols;
        if let Some(m) = mats.iter().find(|m| m.cols != input) {
            return Err(EngineError::Config(format!(
                "fused matrices disagree on input width: '{}' has {} columns, '{}' has {}",
                first.name, input, m.name, m.cols
            )));
        }
        let output = mats.iter().map(|m| m.rows).sum();
        Ok(Self {
            macs: mats.iter().map(CpuMatrix::macs).sum(),
            unit: mats.iter().max_by_key(|m| m.macs()).map(CpuMatrix::unit),
            mats,
            residual,
            shape: KernelShape { input, output },
        })
    }
}

impl Kernel for CpuLinear {
    fn shape(&self) -> KernelShape {
        self.shape
    }

    fn run(&self, inputs: &[&Batch], out: &mut Batch) -> Result<Dispatch> {
        let start = Instant::now();
        let (x, r) = check_inputs(inputs, self.shape, self.residual)?;
        let lanes = x.lanes();
        out.resize(lanes, self.shape.output);
        with_scratch(|s| self.run_with(x, r, out, s))?;
        Ok(Dispatch {
            lanes,
            weight_bytes: self.mats.iter().map(|m| m.weight_bytes as u64).sum(),
            activation_bytes: 4 * (x.as_slice().len() + out.as_slice().len()) as u64,
            elapsed: start.elapsed(),
            modelled: None,
            macs: self.macs * lanes as u64,
            unit: self.unit,
        })
    }
}

impl CpuLinear {
    /// The fused matrices' packed forms (the first `n` of the array), when every one has one and
    /// all take the same activations (one format, or K-quants only): then they share one
    /// quantised input and one loop. No allocation: this
    /// runs for every layer of every step.
    fn packed_together(&self) -> Option<([&anelm_kernels::PackedMatrix; anelm_kernels::MAX_FUSED], usize)> {
        let first = self.mats.first()?;
        let n = self.mats.len();
        if n > anelm_kernels::MAX_FUSED || self.mats.iter().any(|m| !first.format.shares_activations(m.format)) {
            return None;
        }
        let mut refs = [first.packed.as_ref()?; anelm_kernels::MAX_FUSED];
        for (r, m) in refs.iter_mut().zip(&self.mats) {
            *r = m.packed.as_ref()?;
        }
        Some((refs, n))
    }

    /// Every fused matrix's bf16 form, when all have one.
    fn bf16_together(&self) -> Option<Vec<&Bf16Matrix>> {
        self.mats.iter().map(|m| m.bf16.as_ref()).collect()
    }

    fn run_with(&self, x: &Batch, r: Option<&Batch>, out: &mut Batch, s: &mut Scratch) -> Result<()> {
        let lanes = x.lanes();
        let Scratch {
            act, act_bf16, part, ..
        } = s;
        if let Some(mats) = self.bf16_together() {
            act_bf16.quantize(x.as_slice(), lanes, self.shape.input)?;
            Bf16Matrix::matmul_concat(&mats, act_bf16, out.as_mut_slice())?;
        } else if let [m] = self.mats.as_slice() {
            act.quantize(m.format, x.as_slice(), lanes, m.cols)?;
            m.matmul(act, out.as_mut_slice())?;
        } else if let Some((packed, n)) = self.packed_together() {
            // One parallel loop for all of them, rows written straight into place.
            act.quantize(self.mats[0].format, x.as_slice(), lanes, self.shape.input)?;
            anelm_kernels::PackedMatrix::matmul_concat(&packed[..n], act, out.as_mut_slice())?;
        } else {
            let mut offset = 0;
            for (i, m) in self.mats.iter().enumerate() {
                // Quantise afresh for the first matrix (the buffer holds the previous run's
                // activations), then only when a format needs other activations.
                if i == 0 || !act.pairs_with(m.format) {
                    act.quantize(m.format, x.as_slice(), lanes, m.cols)?;
                }
                part.resize(lanes * m.rows, 0.0);
                m.matmul(act, part)?;
                for lane in 0..lanes {
                    out.lane_mut(lane)[offset..offset + m.rows]
                        .copy_from_slice(&part[lane * m.rows..(lane + 1) * m.rows]);
                }
                offset += m.rows;
            }
        }
        if let Some(r) = r {
            for (y, r) in out.as_mut_slice().iter_mut().zip(r.as_slice()) {
                *y += *r;
            }
        }
        Ok(())
    }
}

/// `SwiGluResidual` / `SwiGluAccumulate`: y = r + D(silu(G·x) ⊙ U·x).
struct CpuSwiGlu {
    gate: CpuMatrix,
    up: CpuMatrix,
    down: CpuMatrix,
    shape: KernelShape,
}

impl CpuSwiGlu {
    fn new(gate: CpuMatrix, up: CpuMatrix, down: CpuMatrix) -> Result<Self> {
        let (ffn, hidden) = (gate.rows, gate.cols);
        up.expect_shape(ffn, hidden)?;
        down.expect_shape(hidden, ffn)?;
        Ok(Self {
            shape: KernelShape {
                input: hidden,
                output: hidden,
            },
            gate,
            up,
            down,
        })
    }
}

impl Kernel for CpuSwiGlu {
    fn shape(&self) -> KernelShape {
        self.shape
    }

    fn run(&self, inputs: &[&Batch], out: &mut Batch) -> Result<Dispatch> {
        let start = Instant::now();
        let (x, r) = check_inputs(inputs, self.shape, true)?;
        let lanes = x.lanes();
        with_scratch(|s| self.run_with(x, r, out, s))?;
        let weight_bytes = (self.gate.weight_bytes + self.up.weight_bytes + self.down.weight_bytes) as u64;
        Ok(Dispatch {
            lanes,
            weight_bytes,
            activation_bytes: 4 * (x.as_slice().len() * 2 + out.as_slice().len()) as u64,
            elapsed: start.elapsed(),
            modelled: None,
            macs: (self.gate.macs() + self.up.macs() + self.down.macs()) * lanes as u64,
            unit: Some(self.down.unit()),
        })
    }
}

impl CpuSwiGlu {
    fn run_with(&self, x: &Batch, r: Option<&Batch>, out: &mut Batch, s: &mut Scratch) -> Result<()> {
        let lanes = x.lanes();
        let ffn = self.gate.rows;
        let Scratch {
            act,
            act_bf16,
            act_down,
            gate,
            up,
            ..
        } = s;
        gate.resize(lanes * ffn, 0.0);
        if let (Some(g), Some(u), Some(d)) = (&self.gate.bf16, &self.up.bf16, &self.down.bf16) {
            up.resize(lanes * ffn, 0.0);
            act_bf16.quantize(x.as_slice(), lanes, self.gate.cols)?;
            g.matmul(act_bf16, gate)?;
            u.matmul(act_bf16, up)?;
            anelm_kernels::silu_mul(gate, up);
            act_bf16.quantize(gate, lanes, ffn)?;
            out.resize(lanes, self.shape.output);
            d.matmul(act_bf16, out.as_mut_slice())?;
            if let Some(r) = r {
                for (y, r) in out.as_mut_slice().iter_mut().zip(r.as_slice()) {
                    *y += *r;
                }
            }
            return Ok(());
        }
        act.quantize(self.gate.format, x.as_slice(), lanes, self.gate.cols)?;
        match (&self.gate.packed, &self.up.packed) {
            (Some(g), Some(u)) if self.gate.format.shares_activations(self.up.format) => {
                // Gate and up in one loop, `silu(g) · u` made by the tasks that computed them,
                // which also quantise it for the down projection.
                let combine = |g: &mut [f32], u: &[f32]| anelm_kernels::silu_mul(g, u);
                let next = Some((self.down.format, &mut *act_down));
                anelm_kernels::PackedMatrix::matmul_pair(g, u, act, gate, &combine, next)?;
            }
            _ => {
                up.resize(lanes * ffn, 0.0);
                self.gate.matmul(act, gate)?;
                if !act.pairs_with(self.up.format) {
                    act.quantize(self.up.format, x.as_slice(), lanes, self.up.cols)?;
                }
                self.up.matmul(act, up)?;
                anelm_kernels::silu_mul(gate, up);
                act_down.quantize(self.down.format, gate, lanes, ffn)?;
            }
        }
        out.resize(lanes, self.shape.output);
        self.down.matmul(act_down, out.as_mut_slice())?;
        if let Some(r) = r {
            for (y, r) in out.as_mut_slice().iter_mut().zip(r.as_slice()) {
                *y += *r;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anelm_model::error::ModelError;
    use anelm_model::tensor_store::TensorView;
    use std::sync::Mutex;

    /// One bf16 tensor `w` that records how many of its bytes it was told to release.
    struct Bf16Store {
        rows: usize,
        cols: usize,
        data: Vec<u8>,
        released: Mutex<usize>,
    }

    impl TensorStore for Bf16Store {
        fn tensor(&self, name: &str) -> std::result::Result<TensorView<'_>, ModelError> {
            if name != "w" {
                return Err(ModelError::MissingTensor { name: name.into() });
            }
            Ok(TensorView {
                name: "w",
                format: WeightFormat::BF16,
                shape: vec![self.rows, self.cols],
                data: &self.data,
            })
        }
        fn contains(&self, name: &str) -> bool {
            name == "w"
        }
        fn tensor_names(&self) -> Vec<&str> {
            vec!["w"]
        }
        fn release(&self, bytes: &[u8]) {
            *self.released.lock().unwrap() += bytes.len();
        }
    }

    /// A matrix quantised at load keeps one copy: where the CPU packs the target format, the
    /// packed form only (no row-major quantised bytes behind it), every float byte released, and
    /// the same products as the row-major quantised matrix.
    #[test]
    fn quantised_matrices_hold_one_copy_and_multiply_as_the_row_major_one() {
        let (rows, cols) = (64, 512);
        let values: Vec<f32> = (0..rows * cols).map(|i| ((i * 53 % 97) as f32 - 48.0) / 40.0).collect();
        let mut data = vec![0u8; 2 * rows * cols];
        anelm_kernels::quantize_row(WeightFormat::BF16, &values, &mut data).unwrap();
        let store = Arc::new(Bf16Store {
            rows,
            cols,
            data,
            released: Mutex::new(0),
        });
        let dyn_store: Arc<dyn TensorStore> = store.clone();
        let m = CpuMatrix::quantized(StoredMatrix::load(&dyn_store, "w").unwrap(), LoadQuantization::Q8_0).unwrap();
        assert_eq!((m.format, m.rows, m.cols), (WeightFormat::Q8_0, rows, cols));
        assert_eq!(m.weight_bytes, rows * cols / 32 * 34);
        assert!(*store.released.lock().unwrap() >= 2 * rows * cols, "float pages held");
        if m.packed.is_some() {
            assert!(
                m.stored.is_none(),
                "a row-major quantised copy is held beside the packed one"
            );
        }
        let reference = quantize_matrix(StoredMatrix::load(&dyn_store, "w").unwrap(), LoadQuantization::Q8_0).unwrap();
        let lanes = 2;
        let x: Vec<f32> = (0..lanes * cols).map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0).collect();
        let mut act = Activations::new();
        act.quantize(WeightFormat::Q8_0, &x, lanes, cols).unwrap();
        let (mut got, mut want) = (vec![0.0; lanes * rows], vec![0.0; lanes * rows]);
        m.matmul(&act, &mut got).unwrap();
        CpuMatrix::new(reference, false)
            .unwrap()
            .matmul(&act, &mut want)
            .unwrap();
        assert_eq!(got, want);
        assert!(got.iter().any(|&v| v != 0.0));
    }
}
