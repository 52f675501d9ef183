//! The 256-element GGUF formats without kernels of their own — Q2_K, Q3_K and IQ4_XS: each block
//! is decoded once per pass over a row into int16 weights with its sub-block scales folded in
//! (`w = q·scale`, |w| ≤ 127·32), then dotted with every lane's Q8_K activations in exact
//! integer sums, as ggml's CPU dots do.
//!
//! The portable body here is the reference and the aarch64 path (the compiler vectorises its
//! int16 × int8 sums with NEON); x86-64 CPUs with AVX2 run `scaled_blocks_x86.rs`, which gives
//! the same integer sums.

use crate::activations::Activations;
use crate::blocks::{unpack_iq4_xs, unpack_q2_k, unpack_q3_k};
use crate::format::WeightFormat;

/// Whether `fmt` runs through this module.
pub(crate) fn handles(fmt: WeightFormat) -> bool {
    matches!(fmt, WeightFormat::Q2_K | WeightFormat::Q3_K | WeightFormat::IQ4_XS)
}

/// One 256-element block: element `e` is `d·w[e] − dmin·min[e / 16]`.
struct Scaled {
    w: [i16; 256],
    min: [i16; 16],
    d: f32,
    dmin: f32,
    /// Whether the format has sub-block minimums (Q2_K).
    has_min: bool,
}

impl Scaled {
    fn new() -> Self {
        Self {
            w: [0; 256],
            min: [0; 16],
            d: 0.0,
            dmin: 0.0,
            has_min: false,
        }
    }

    /// Decode one block of a 256-element format (`q` is scratch).
    #[inline(always)]
    fn decode(&mut self, fmt: WeightFormat, b: &[u8], q: &mut [i8; 256]) {
        match fmt {
            WeightFormat::Q2_K => {
                let mut sc = [0u8; 16];
                (self.d, self.dmin) = unpack_q2_k(b, q, &mut sc);
                for (j, &s) in sc.iter().enumerate() {
                    scale_into(
                        &mut self.w[16 * j..16 * j + 16],
                        &q[16 * j..16 * j + 16],
                        i16::from(s & 0x0F),
                    );
                    self.min[j] = i16::from(s >> 4);
                }
                self.has_min = true;
            }
            WeightFormat::Q3_K => {
                let mut sc = [0i8; 16];
                self.d = unpack_q3_k(b, q, &mut sc);
                for (j, &s) in sc.iter().enumerate() {
                    scale_into(&mut self.w[16 * j..16 * j + 16], &q[16 * j..16 * j + 16], i16::from(s));
                }
                self.has_min = false;
            }
            _ => {
                let mut sc = [0i8; 8];
                self.d = unpack_iq4_xs(b, q, &mut sc);
                for (j, &s) in sc.iter().enumerate() {
                    scale_into(&mut self.w[32 * j..32 * j + 32], &q[32 * j..32 * j + 32], i16::from(s));
                }
                self.has_min = false;
            }
        }
    }
}

/// `w[i] = scale · q[i]` for one sub-block.
#[inline(always)]
fn scale_into(w: &mut [i16], q: &[i8], scale: i16) {
    for (w, &q) in w.iter_mut().zip(q) {
        *w = scale * i16::from(q);
    }
}

/// Σ w·x over one block, exact in i32 (|Σ| ≤ 256 · 4064 · 127 < 2³¹).
#[inline(always)]
fn dot_i16_i8<const N: usize>(w: &[i16; N], x: &[i8]) -> i32 {
    let x = &x[..N];
    let mut sum = 0i32;
    for (a, b) in w.iter().zip(x) {
        sum += i32::from(*a) * i32::from(*b);
    }
    sum
}

/// acc[l] += W_row · x[lane0 + l], the portable body every variant compiles.
#[inline(always)]
fn dot_row_body(fmt: WeightFormat, row: &[u8], x: &Activations, lane0: usize, acc: &mut [f32]) {
    let bb = fmt.block_bytes();
    let nb = x.cols / 256;
    let mut q = [0i8; 256];
    let mut blk = Scaled::new();
    for (ib, b) in row.chunks_exact(bb).enumerate() {
        blk.decode(fmt, b, &mut q);
        for (l, a) in acc.iter_mut().enumerate() {
            let xb = (lane0 + l) * nb + ib;
            let sumi = dot_i16_i8(&blk.w, &x.q[256 * xb..]);
            let dx = x.d[xb];
            *a += dx * blk.d * sumi as f32;
            if blk.has_min {
                let bs = &x.bsums[16 * xb..16 * xb + 16];
                let summin: i32 = blk.min.iter().zip(bs).map(|(&m, &s)| i32::from(m) * s).sum();
                *a -= dx * blk.dmin * summin as f32;
            }
        }
    }
}

/// The portable body, for [`crate::Isa::Scalar`] and CPUs without AVX2.
pub(crate) fn dot_row_portable(fmt: WeightFormat, row: &[u8], x: &Activations, lane0: usize, acc: &mut [f32]) {
    dot_row_body(fmt, row, x, lane0, acc);
}

/// acc[l] += W_row · x[lane0 + l] for a row in one of the formats [`handles`] accepts, with
/// activations quantised for it; the widest vectors this CPU has.
pub(crate) fn dot_row(fmt: WeightFormat, row: &[u8], x: &Activations, lane0: usize, acc: &mut [f32]) {
    debug_assert!(handles(fmt));
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected at run time just above.
        unsafe { crate::scaled_blocks_x86::dot_row(fmt, row, x, lane0, acc) };
        return;
    }
    dot_row_portable(fmt, row, x, lane0, acc);
}
