//! Symmetric int8 weight quantisation with fp16 scales (per row, or per block along the input axis).
//!
//! The C++ system quantises each output row with `scale = max|w| / 127` and
//! `q = round(w / scale)` clamped to [−128, 127], stores the scale as fp16 and dequantises in
//! the program with `constexpr_blockwise_shift_scale` (`ane-runtime.md` §3.6). Two deliberate
//! refinements here: `q` is computed against the **fp16-rounded** scale (the value the hardware
//! actually multiplies by), and the scale is at least the smallest normal fp16 (6.1e-5) so it
//! never becomes a subnormal the ANE may flush to zero.

use half::f16;

use crate::error::LowerError;

/// A quantised `[rows, cols]` matrix: int8 data row-major, fp16 scales `[rows, cols / block]`.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedMatrix {
    /// int8 values, row-major `[rows, cols]`.
    pub data: Vec<i8>,
    /// fp16 scales, row-major `[rows, blocks_per_row]`.
    pub scales: Vec<f16>,
    /// Columns per scale.
    pub block: usize,
}

impl QuantizedMatrix {
    /// Scales per row.
    pub fn blocks_per_row(&self, cols: usize) -> usize {
        cols / self.block.max(1)
    }

    /// The dequantised value at (r, c) in f32 (int8 × fp16 scale, before any fp16 rounding).
    pub fn dequant(&self, cols: usize, r: usize, c: usize) -> f32 {
        let s = self.scales[r * self.blocks_per_row(cols) + c / self.block];
        f32::from(self.data[r * cols + c]) * s.to_f32()
    }
}

/// Resolve a block size for a matrix with `cols` columns: `None` means the whole row.
pub fn resolve_block(block: Option<usize>, cols: usize) -> Result<usize, LowerError> {
    match block {
        None => Ok(cols),
        Some(b) if b > 0 && cols % b == 0 => Ok(b),
        Some(b) => Err(LowerError::BadBlock { block: b, cols }),
    }
}

/// Quantise a row-major `[rows, cols]` f32 matrix to int8 with one fp16 scale per `block`
/// columns of each row (`block = None`: one per row).
pub fn quantize_int8(w: &[f32], rows: usize, cols: usize, block: Option<usize>) -> Result<QuantizedMatrix, LowerError> {
    let block = resolve_block(block, cols)?;
    if Some(w.len()) != rows.checked_mul(cols) {
        return Err(LowerError::WeightShape {
            name: "int8 matrix".into(),
            expected: rows.saturating_mul(cols),
            found: w.len(),
        });
    }
    let mut data = vec![0i8; w.len()];
    let mut scales = Vec::with_capacity(w.len().checked_div(block).unwrap_or(0));
    if block == 0 {
        return Ok(QuantizedMatrix { data, scales, block: 1 });
    }
    for (src, dst) in w.chunks_exact(block).zip(data.chunks_exact_mut(block)) {
        let amax = src.iter().fold(0.0f32, |m, &x| if x.abs() > m { x.abs() } else { m });
        let scale = f16::from_f32((amax / 127.0).max(f16::MIN_POSITIVE.to_f32()));
        let s = scale.to_f32();
        for (q, &x) in dst.iter_mut().zip(src) {
            *q = (x / s).round().clamp(-128.0, 127.0) as i8;
        }
        scales.push(scale);
    }
    Ok(QuantizedMatrix { data, scales, block })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_row_and_blockwise() {
        let w = [1.0f32, -0.5, 0.25, 0.0, 0.01, 0.02, -0.03, 0.04];
        let q = quantize_int8(&w, 2, 4, None).unwrap();
        assert_eq!(q.scales.len(), 2);
        assert_eq!(q.data[0], 127);
        assert_eq!(q.data[1], -64);
        for (i, &x) in w.iter().enumerate() {
            let err = (q.dequant(4, i / 4, i % 4) - x).abs();
            let half_step = q.scales[i / 4].to_f32() / 2.0;
            assert!(err <= half_step * 1.0001, "{i}: {err} > {half_step}");
        }
        let b = quantize_int8(&w, 2, 4, Some(2)).unwrap();
        assert_eq!(b.scales.len(), 4);
        assert!(quantize_int8(&w, 2, 4, Some(3)).is_err());
        assert!(quantize_int8(&w, 3, 4, None).is_err());
        let z = quantize_int8(&[0.0; 4], 1, 4, None).unwrap();
        assert!(z.data.iter().all(|&v| v == 0));
        assert!(z.scales[0].is_normal());
    }
}
