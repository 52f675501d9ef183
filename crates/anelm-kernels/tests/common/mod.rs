//! Helpers the kernel tests share: a seeded generator of values in [−1, 1) and a row-major
//! encoder of f32 weights into a stored format.
// Each test crate that includes this module uses a subset of it.
#![allow(dead_code)]

use anelm_kernels::{WeightFormat, quantize_row};

/// A linear congruential generator: the same seed gives the same values in every test.
pub struct Rng(pub u64);

impl Rng {
    /// The next value in [−1, 1).
    pub fn f(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// The next `n` values.
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }
}

/// `rows × cols` f32 weights encoded row by row in `fmt`.
pub fn encode(fmt: WeightFormat, w: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    let rb = fmt.row_bytes(cols).expect("row bytes");
    let mut out = vec![0u8; rb * rows];
    for r in 0..rows {
        quantize_row(fmt, &w[r * cols..(r + 1) * cols], &mut out[r * rb..(r + 1) * rb]).expect("quantize");
    }
    out
}
