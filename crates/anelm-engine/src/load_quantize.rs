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

/// `m` re-encoded in `q`'s format (see the module documentation for which matrices change),
/// its file pages released; otherwise `m` unchanged.
pub fn quantize_matrix(m: StoredMatrix, q: LoadQuantization) -> Result<StoredMatrix> {
    if !matches!(m.format, WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16) {
        return Ok(m);
    }
    let target = [q.format(), WeightFormat::Q8_0]
        .into_iter()
        .find(|f| m.cols % f.block_elems() == 0);
    let Some(target) = target else { return Ok(m) };
    let (rows, cols) = (m.rows, m.cols);
    let row_bytes = target.row_bytes(cols)?;
    let total = row_bytes
        .checked_mul(rows)
        .ok_or_else(|| EngineError::Config(format!("tensor '{}' is too large to quantise", m.name)))?;
    let mut data = vec![0u8; total];
    // Rows in parallel, a few hundred at a time; each task decodes into its own f32 row.
    const ROWS_PER_TASK: usize = 256;
    let failed = std::sync::atomic::AtomicBool::new(false);
    anelm_kernels::pool::global().for_each_chunk_mut(&mut data, row_bytes * ROWS_PER_TASK, &|task, dst| {
        let mut row = vec![0.0f32; cols];
        for (i, out) in dst.chunks_exact_mut(row_bytes).enumerate() {
            let r = task * ROWS_PER_TASK + i;
            let ok = m
                .row_bytes(r)
                .is_some_and(|src| anelm_kernels::dequantize_row(m.format, src, &mut row).is_ok())
                && anelm_kernels::quantize_row(target, &row, out).is_ok();
            if !ok {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                return;
            }
        }
    });
    if failed.into_inner() {
        return Err(EngineError::Config(format!(
            "tensor '{}': could not quantise its {rows}×{cols} {} rows to {}",
            m.name,
            m.format.name(),
            target.name()
        )));
    }
    m.release_pages(m.bytes());
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
}
