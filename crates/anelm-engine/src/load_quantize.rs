//! Load-time quantisation of float matrices (`--quantize q8_0|q4_0|q4_k`).
//!
//! Hugging Face checkpoints (how Qwen3.5 ships) store bf16 or f16 weights. The CPU backend runs
//! them as stored, streaming 2 bytes per weight every decode step through the float kernels.
//! Re-encoding each float matrix once at load into a block format (Q8_0: 34 bytes per 32
//! weights) lets its matmuls take the quantised kernels, packed where the CPU has them, and cuts
//! the bytes a decode step streams. The encoders are `anelm_kernels::quantize_row`'s
//! round-to-nearest ones (for Q8_0 the same rule as llama.cpp's reference quantiser; not the
//! search-based K-quant encoders of `llama-quantize`). Matrices already in a block format (GGUF
//! files) are kept as they are. A matrix whose row length is not a whole number of the target's
//! blocks falls back to Q8_0 (32-weight blocks), and stays in its float format if even that does
//! not divide it.

use std::sync::Arc;

use anelm_kernels::WeightFormat;
use anelm_model::error::ModelError;
use anelm_model::tensor_store::{TensorStore, TensorView};

use crate::error::{EngineError, Result};
use crate::stored_matrix::StoredMatrix;

/// The formats float matrices can be quantised to at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadQuantization {
    /// 8-bit blocks of 32 with an f16 scale (~1.06 bytes per weight).
    Q8_0,
    /// 4-bit blocks of 32 with an f16 scale (~0.56 bytes per weight).
    Q4_0,
    /// 4-bit super-blocks of 256 with 6-bit sub-block scales and minimums (~0.56 bytes per weight).
    Q4K,
}

impl LoadQuantization {
    /// Every choice, in the order the CLI lists them.
    pub const ALL: [Self; 3] = [Self::Q8_0, Self::Q4_0, Self::Q4K];

    /// The name the CLI takes (`q8_0`, `q4_0`, `q4_k`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
            Self::Q4K => "q4_k",
        }
    }

    /// Parse a CLI name (case-insensitive); `None` for an unknown one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|q| q.name().eq_ignore_ascii_case(name))
    }

    /// The names [`LoadQuantization::parse`] takes, comma-separated (for error messages).
    pub fn choices() -> String {
        Self::ALL.map(Self::name).join(", ")
    }

    /// The stored format it produces.
    pub fn format(self) -> WeightFormat {
        match self {
            Self::Q8_0 => WeightFormat::Q8_0,
            Self::Q4_0 => WeightFormat::Q4_0,
            Self::Q4K => WeightFormat::Q4_K,
        }
    }
}

/// The format `q` turns `m` into: `q`'s own, or Q8_0 where the row length is not a whole
/// number of `q`'s blocks; `None` where `m` stays as it is (a block format already, or a row
/// length no block format divides).
pub fn target_format(m: &StoredMatrix, q: LoadQuantization) -> Option<WeightFormat> {
    if !matches!(m.format, WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16) {
        return None;
    }
    [q.format(), WeightFormat::Q8_0]
        .into_iter()
        .find(|f| m.cols % f.block_elems() == 0)
}

/// Rows quantised per pool task.
const ROWS_PER_TASK: usize = 256;

/// Quantise rows `first ..` of `m` into `dst` (whole rows of `target`), in parallel, a few
/// hundred rows per task, each task giving its float rows' pages back when it is done with them.
/// `false` if a row could not be decoded or encoded.
fn quantize_rows(m: &StoredMatrix, target: WeightFormat, first: usize, dst: &mut [u8]) -> bool {
    let Ok(row_bytes) = target.row_bytes(m.cols) else {
        return false;
    };
    if row_bytes == 0 || dst.len() % row_bytes != 0 {
        return false;
    }
    let failed = std::sync::atomic::AtomicBool::new(false);
    anelm_kernels::pool::global().for_each_chunk_mut(dst, row_bytes * ROWS_PER_TASK, &|task, dst| {
        let mut row = vec![0.0f32; m.cols];
        let rows = first + task * ROWS_PER_TASK..first + task * ROWS_PER_TASK + dst.len() / row_bytes;
        for (r, out) in rows.clone().zip(dst.chunks_exact_mut(row_bytes)) {
            let ok = m
                .row_bytes(r)
                .is_some_and(|src| anelm_kernels::dequantize_row(m.format, src, &mut row).is_ok())
                && anelm_kernels::quantize_row(target, &row, out).is_ok();
            if !ok {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                return;
            }
        }
        let src_row = m.bytes().len() / m.rows.max(1);
        if let Some(done) = m.bytes().get(rows.start * src_row..rows.end * src_row) {
            m.release_pages(done);
        }
    });
    !failed.into_inner()
}

fn quantize_failed(m: &StoredMatrix, target: WeightFormat) -> EngineError {
    EngineError::Config(format!(
        "tensor '{}': could not quantise its {}×{} {} rows to {}",
        m.name,
        m.rows,
        m.cols,
        m.format.name(),
        target.name()
    ))
}

/// `m` quantised to `target` (from [`target_format`]) straight into the packed layout, a window
/// of rows at a time, the float pages given back as each window is done: the row-major
/// quantised matrix never exists whole, so a load holds about one copy of the weights plus a
/// window. `Ok(None)` where this CPU has no packed kernel for `target` at this shape.
pub fn quantize_packed(m: &StoredMatrix, target: WeightFormat) -> Result<Option<anelm_kernels::PackedMatrix>> {
    let mut failed = false;
    let packed = anelm_kernels::PackedMatrix::pack_filled(target, m.rows, m.cols, &mut |first, dst| {
        if quantize_rows(m, target, first, dst) {
            Ok(())
        } else {
            failed = true;
            Err(anelm_kernels::KernelError::Overflow)
        }
    });
    match packed {
        Err(_) if failed => Err(quantize_failed(m, target)),
        other => Ok(other?),
    }
}

/// `m` re-encoded row-major in `q`'s format (see the module documentation for which matrices
/// change), its file pages released as its rows are done; otherwise `m` unchanged.
pub fn quantize_matrix(m: StoredMatrix, q: LoadQuantization) -> Result<StoredMatrix> {
    let Some(target) = target_format(&m, q) else {
        return Ok(m);
    };
    let (rows, cols) = (m.rows, m.cols);
    let total = target
        .row_bytes(cols)?
        .checked_mul(rows)
        .ok_or_else(|| EngineError::Config(format!("tensor '{}' is too large to quantise", m.name)))?;
    let mut data = vec![0u8; total];
    if !quantize_rows(&m, target, 0, &mut data) {
        return Err(quantize_failed(&m, target));
    }
    let store: Arc<dyn TensorStore> = Arc::new(OwnedTensor {
        name: m.name.clone(),
        format: target,
        shape: vec![rows, cols],
        data,
    });
    StoredMatrix::load(&store, &m.name)
}

/// One tensor held in memory: the store behind a matrix quantised at load.
struct OwnedTensor {
    name: String,
    format: WeightFormat,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl TensorStore for OwnedTensor {
    fn tensor(&self, name: &str) -> std::result::Result<TensorView<'_>, ModelError> {
        if name != self.name {
            return Err(ModelError::MissingTensor { name: name.to_string() });
        }
        Ok(TensorView {
            name: &self.name,
            format: self.format,
            shape: self.shape.clone(),
            data: &self.data,
        })
    }

    fn contains(&self, name: &str) -> bool {
        name == self.name
    }

    fn tensor_names(&self) -> Vec<&str> {
        vec![&self.name]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_unknown_ones_do_not() {
        for q in LoadQuantization::ALL {
            assert_eq!(LoadQuantization::parse(q.name()), Some(q));
            assert_eq!(LoadQuantization::parse(&q.name().to_uppercase()), Some(q));
        }
        assert_eq!(LoadQuantization::parse("q3_x"), None);
        assert_eq!(LoadQuantization::choices(), "q8_0, q4_0, q4_k");
    }

    fn matrix(format: WeightFormat, rows: usize, cols: usize) -> (StoredMatrix, Vec<f32>) {
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
            .collect();
        let mut data = vec![0u8; format.row_bytes(cols).unwrap() * rows];
        let rb = format.row_bytes(cols).unwrap();
        for (src, dst) in values.chunks(cols).zip(data.chunks_mut(rb)) {
            anelm_kernels::quantize_row(format, src, dst).unwrap();
        }
        let store: Arc<dyn TensorStore> = Arc::new(OwnedTensor {
            name: "w".into(),
            format,
            shape: vec![rows, cols],
            data,
        });
        (StoredMatrix::load(&store, "w").unwrap(), values)
    }

    #[test]
    fn float_matrices_are_requantised_and_decode_close() {
        // 70 rows: two full tasks of rows would need 512, so this also covers a short last task.
        let (m, values) = matrix(WeightFormat::BF16, 70, 512);
        let q = quantize_matrix(m, LoadQuantization::Q8_0).unwrap();
        assert_eq!((q.format, q.rows, q.cols), (WeightFormat::Q8_0, 70, 512));
        let back = q.to_f32().unwrap();
        let worst = back
            .iter()
            .zip(&values)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        // |x| ≤ 0.79: bf16 rounding (≤ 2^-9 relative) plus half a Q8_0 step (amax / 254).
        assert!(worst < 0.79 / 254.0 + 0.79 / 256.0, "worst {worst}");
        let (m, _) = matrix(WeightFormat::F16, 3, 512);
        assert_eq!(
            quantize_matrix(m, LoadQuantization::Q4K).unwrap().format,
            WeightFormat::Q4_K
        );
    }

    #[test]
    fn rows_the_target_cannot_hold_fall_back() {
        // 96 columns: not a multiple of Q4_K's 256, a multiple of Q8_0's 32.
        let (m, _) = matrix(WeightFormat::F32, 2, 96);
        assert_eq!(
            quantize_matrix(m, LoadQuantization::Q4K).unwrap().format,
            WeightFormat::Q8_0
        );
        // 40 columns fit no block format: the matrix stays as it is.
        let (m, _) = matrix(WeightFormat::F32, 2, 40);
        assert_eq!(
            quantize_matrix(m, LoadQuantization::Q8_0).unwrap().format,
            WeightFormat::F32
        );
        // Block formats are kept.
        let (m, _) = matrix(WeightFormat::Q4_0, 2, 64);
        assert_eq!(
            quantize_matrix(m, LoadQuantization::Q8_0).unwrap().format,
            WeightFormat::Q4_0
        );
    }

    /// A one-tensor store that records which byte ranges (offsets into the tensor) it was told
    /// to release.
    struct Recording {
        inner: OwnedTensor,
        released: std::sync::Mutex<Vec<(usize, usize)>>,
    }

    impl TensorStore for Recording {
        fn tensor(&self, name: &str) -> std::result::Result<TensorView<'_>, ModelError> {
            self.inner.tensor(name)
        }
        fn contains(&self, name: &str) -> bool {
            self.inner.contains(name)
        }
        fn tensor_names(&self) -> Vec<&str> {
            self.inner.tensor_names()
        }
        fn release(&self, bytes: &[u8]) {
            let start = bytes.as_ptr() as usize - self.inner.data.as_ptr() as usize;
            self.released.lock().unwrap().push((start, start + bytes.len()));
        }
    }

    /// A bf16 matrix in a [`Recording`] store, and the store.
    fn recorded(rows: usize, cols: usize) -> (StoredMatrix, Arc<Recording>) {
        let (m, _) = matrix(WeightFormat::BF16, rows, cols);
        let store = Arc::new(Recording {
            inner: OwnedTensor {
                name: "w".into(),
                format: WeightFormat::BF16,
                shape: vec![rows, cols],
                data: m.bytes().to_vec(),
            },
            released: Default::default(),
        });
        let dyn_store: Arc<dyn TensorStore> = store.clone();
        (StoredMatrix::load(&dyn_store, "w").unwrap(), store)
    }

    /// Every byte of the source was released, and no single release was larger than one task's
    /// rows (so pages go back as quantisation proceeds, not all at the end).
    fn assert_released_in_steps(store: &Recording, total: usize, row_bytes: usize) {
        let mut ranges = store.released.lock().unwrap().clone();
        assert!(ranges.len() > 1, "released in {} call(s)", ranges.len());
        for &(a, b) in &ranges {
            assert!(b - a <= ROWS_PER_TASK * row_bytes, "one release of {} bytes", b - a);
        }
        ranges.sort();
        let mut covered = 0;
        for (a, b) in ranges {
            assert!(a <= covered, "bytes {covered}..{a} never released");
            covered = covered.max(b);
        }
        assert_eq!(covered, total);
    }

    #[test]
    fn row_major_quantisation_releases_every_source_row_as_it_goes() {
        let (rows, cols) = (600, 256);
        let (m, store) = recorded(rows, cols);
        let q = quantize_matrix(m, LoadQuantization::Q8_0).unwrap();
        assert_eq!(q.format, WeightFormat::Q8_0);
        assert_released_in_steps(&store, rows * cols * 2, cols * 2);
    }

    #[test]
    fn packed_quantisation_matches_packing_the_row_major_result_and_releases_as_it_goes() {
        // 2048 rows of 512: the Q8_0 matrix is over 1 MB, so packing takes more than one window.
        let (rows, cols) = (2048, 512);
        for q in LoadQuantization::ALL {
            let (m, store) = recorded(rows, cols);
            let target = target_format(&m, q).unwrap();
            let row_major = quantize_matrix(recorded(rows, cols).0, q).unwrap();
            let reference = anelm_kernels::PackedMatrix::pack(target, row_major.bytes(), rows, cols).unwrap();
            let packed = quantize_packed(&m, target).unwrap();
            assert_eq!(packed.is_some(), reference.is_some(), "{}", q.name());
            let (Some(packed), Some(reference)) = (packed, reference) else {
                // No packed kernel on this CPU: nothing was read or released.
                assert!(store.released.lock().unwrap().is_empty());
                continue;
            };
            assert_released_in_steps(&store, rows * cols * 2, cols * 2);
            let lanes = 3;
            let x: Vec<f32> = (0..lanes * cols).map(|i| ((i * 13 % 29) as f32 - 14.0) / 8.0).collect();
            let mut act = anelm_kernels::Activations::new();
            act.quantize(target, &x, lanes, cols).unwrap();
            let (mut got, mut want) = (vec![0.0f32; lanes * rows], vec![0.0f32; lanes * rows]);
            packed.matmul(&act, &mut got).unwrap();
            reference.matmul(&act, &mut want).unwrap();
            assert_eq!(got, want, "{}", q.name());
        }
    }
}
