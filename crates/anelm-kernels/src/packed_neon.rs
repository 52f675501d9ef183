//! The aarch64 kernels of [`crate::packed`]: one group of 8 interleaved rows (the layout of
//! `packed_layout.rs`, the same bytes the x86 AVX2 kernels read) against up to [`MAX_LANES`]
//! activation lanes, for Q4_1, Q8_0, Q4_0 and Q5_0 here and the K-quants (with Q3_K and IQ4_XS)
//! in `packed_neon_kquant.rs`. Each block's weights are decoded once per group and dotted with
//! every lane of a tile of up to four.
//!
//! The kernels exist twice, from one macro: [`sdot`] (compiled for dotprod, block dots with
//! `sdot`) and [`smull`] (any aarch64 CPU); see `packed_neon_dot.rs`. Each copy is compiled
//! with its own target features all the way down, so `sdot`'s assembly inlines into the loops
//! (a kernel compiled without dotprod could not take it inline: it was called out of line 140
//! times per kernel set).
//!
//! The integer block dots are exact and each block's scales are applied in the scalar
//! reference's order with separate multiplies and adds (no fused multiply-add), so the results
//! have exactly the bits of the row-major kernels (`matmul.rs`, `simd_neon.rs`) for every format.

use std::arch::aarch64::*;

use crate::format::WeightFormat;
use crate::packed::PACK_ROWS;
use crate::packed_neon_dot::{Quad, load_rows8};

/// Whether these kernels read `fmt`'s packed layout (`PackedMatrix::pack` leaves every other
/// format row-major on aarch64, whatever layouts `packed_layout.rs` knows).
pub(crate) fn serves(fmt: WeightFormat) -> bool {
    matches!(
        fmt,
        WeightFormat::Q4_1
            | WeightFormat::Q8_0
            | WeightFormat::Q4_0
            | WeightFormat::Q5_0
            | WeightFormat::Q4_K
            | WeightFormat::Q5_K
            | WeightFormat::Q6_K
            | WeightFormat::Q3_K
            | WeightFormat::IQ4_XS
    )
}

/// Lanes one call handles (the caller loops over more); tiles of [`TILE_LANES`] inside.
pub(crate) const MAX_LANES: usize = 16;

/// Lanes whose sums one pass over a block's decoded weights keeps.
pub(crate) const TILE_LANES: usize = 4;

/// `out[l] = acc[l]` (rows 0–3, rows 4–7).
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn store<const L: usize>(acc: &[[float32x4_t; 2]; L], out: &mut [[f32; PACK_ROWS]]) {
    for (o, a) in out.iter_mut().zip(acc) {
        // SAFETY: `o` holds exactly 8 f32: 4 at its start and 4 more after; unaligned stores.
        unsafe {
            vst1q_f32(o.as_mut_ptr(), a[0]);
            vst1q_f32(o.as_mut_ptr().add(4), a[1]);
        }
    }
}

/// Zeroed weights of one 32-column block.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn no_weights() -> [Quad; 2] {
    [[[vdupq_n_s8(0); 2]; 4]; 2]
}

/// Into `w`: the low nibbles (columns `4k ..` of a 16-byte quant layout, `w[0][k]`) and high
/// nibbles (columns `16 + 4k ..`, `w[1][k]`) of the 4 packed vectors at the start of `b`, each
/// minus `offset`.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn nibble_weights(b: &[u8], offset: i8, w: &mut [Quad; 2]) {
    let (mask, off) = (vdupq_n_u8(0x0F), vdupq_n_s8(offset));
    let [lo, hi] = w;
    for (k, (l, h)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
        let v = load_rows8(&b[32 * k..]);
        for (r, v) in v.into_iter().enumerate() {
            l[r] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, mask)), off);
            h[r] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)), off);
        }
    }
}

/// Q8_0's weights of one (group, block) `p`: the 8 vectors of signed quants after the scales.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn q8_0_weights(p: &[u8], w: &mut [Quad; 2]) {
    for (k, wk) in w.as_flattened_mut().iter_mut().enumerate() {
        let v = load_rows8(&p[16 + 32 * k..]);
        *wk = [vreinterpretq_s8_u8(v[0]), vreinterpretq_s8_u8(v[1])];
    }
}

/// Q4_0's weights: nibbles minus 8.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn q4_0_weights(p: &[u8], w: &mut [Quad; 2]) {
    nibble_weights(&p[16..], 8, w);
}

/// Q5_0's weights: nibbles with their fifth bits, minus 16. Bit `g` of the fifth-bit vector is
/// the fifth bit of column group `g` (columns `4g .. 4g + 4`), which is `w[g / 4][g % 4]`.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn q5_0_weights(p: &[u8], w: &mut [Quad; 2]) {
    nibble_weights(&p[48..], 0, w);
    let qh = load_rows8(&p[16..]);
    let (sixteen, off) = (vdupq_n_u8(0x10), vdupq_n_s8(16));
    for (g, wk) in w.as_flattened_mut().iter_mut().enumerate() {
        let bit = vdupq_n_u8(1 << g);
        for (v, h) in wk.iter_mut().zip(qh) {
            let fifth = vandq_u8(vtstq_u8(h, bit), sixteen);
            *v = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vreinterpretq_u8_s8(*v), fifth)), off);
        }
    }
}

/// `$tile::<L>` over `$out`'s lanes in tiles of [`TILE_LANES`], then the remainder as one
/// smaller tile.
macro_rules! in_tiles {
    ($tile:ident, $blk:expr, $x:expr, $lane0:expr, $out:expr) => {{
        let out: &mut [[f32; PACK_ROWS]] = $out;
        let mut done = 0;
        while done < out.len() {
            let n = (out.len() - done).min(TILE_LANES);
            let tile = &mut out[done..done + n];
            let lane = $lane0 + done;
            match n {
                4 => $tile::<4>($blk, $x, lane, tile),
                3 => $tile::<3>($blk, $x, lane, tile),
                2 => $tile::<2>($blk, $x, lane, tile),
                _ => $tile::<1>($blk, $x, lane, tile),
            }
            done += n;
        }
    }};
}

/// The kernels, compiled for target features `$features` with the dot engine `$quad` /
/// `$finish` (`packed_neon_dot.rs`); the K-quant kernels come from `packed_neon_kquant.rs`.
macro_rules! neon_kernels {
    ($features:literal, $quad:ident, $finish:ident) => {
        use std::arch::aarch64::*;

        use crate::activations::Activations;
        use crate::format::WeightFormat;
        use crate::packed::PACK_ROWS;
        use crate::packed_neon::{
            TILE_LANES, nibble_weights, no_weights, q4_0_weights, q5_0_weights, q8_0_weights, store,
        };
        use crate::packed_neon_dot::{Quad, dot_zero, f16x8, load16_i8, to_f32, $finish, $quad};

        /// Group `blk` (one 8-row group's blocks, in `fmt`'s packed layout) against lanes
        /// `lane0 .. lane0 + out.len()` of `x`: `out[l][r] = row r · x[lane0 + l]`.
        #[target_feature(enable = $features)]
        pub(crate) fn group(
            fmt: WeightFormat,
            blk: &[u8],
            x: &Activations,
            lane0: usize,
            out: &mut [[f32; PACK_ROWS]],
        ) {
            match fmt {
                WeightFormat::Q4_1 => in_tiles!(q4_1_tile, blk, x, lane0, out),
                WeightFormat::Q8_0 => in_tiles!(q8_0_tile, blk, x, lane0, out),
                WeightFormat::Q4_0 => in_tiles!(q4_0_tile, blk, x, lane0, out),
                WeightFormat::Q5_0 => in_tiles!(q5_0_tile, blk, x, lane0, out),
                WeightFormat::Q4_K => in_tiles!(q4_k_tile, blk, x, lane0, out),
                WeightFormat::Q5_K => in_tiles!(q5_k_tile, blk, x, lane0, out),
                WeightFormat::Q6_K => in_tiles!(q6_k_tile, blk, x, lane0, out),
                WeightFormat::Q3_K => in_tiles!(q3_k_tile, blk, x, lane0, out),
                WeightFormat::IQ4_XS => in_tiles!(iq4_xs_tile, blk, x, lane0, out),
                // `pack_in_groups` builds nothing else here (`serves`).
                _ => out.iter_mut().for_each(|t| t.fill(f32::NAN)),
            }
        }

        /// The 8 row sums of one 32-column block: `w[0]` holds its columns 0–15, `w[1]`
        /// 16–31, `x` the block's 32 activation quants.
        #[inline]
        #[target_feature(enable = $features)]
        fn dot32(w: &[Quad; 2], x: &[i8]) -> [int32x4_t; 2] {
            let acc = $quad(dot_zero(), &w[0], load16_i8(x));
            $finish($quad(acc, &w[1], load16_i8(&x[16..])))
        }

        /// The 8 row sums of 16 columns.
        #[inline]
        #[target_feature(enable = $features)]
        fn dot16(w: &Quad, x: &[i8]) -> [int32x4_t; 2] {
            $finish($quad(dot_zero(), w, load16_i8(x)))
        }

        /// A Q8_0-activation block format (Q8_0, Q4_0, Q5_0): `acc += sumi · (d · dx)` per
        /// block, as `matmul::dot_row` does. `BYTES` per (group, block), f16 scales first;
        /// `decode` writes the block's weights.
        #[inline]
        #[target_feature(enable = $features)]
        fn scaled_blocks<const L: usize, const BYTES: usize>(
            blk: &[u8],
            x: &Activations,
            lane: usize,
            out: &mut [[f32; PACK_ROWS]],
            decode: impl Fn(&[u8], &mut [Quad; 2]),
        ) {
            let nb = x.cols / 32;
            let xq = &x.q[32 * nb * lane..32 * nb * (lane + L)];
            let xd = &x.d[nb * lane..nb * (lane + L)];
            let mut acc = [[vdupq_n_f32(0.0); 2]; L];
            let mut w = no_weights();
            for (b, p) in blk.chunks_exact(BYTES).enumerate().take(nb) {
                let d = f16x8(p);
                decode(p, &mut w);
                for (j, a) in acc.iter_mut().enumerate() {
                    let at = j * nb + b;
                    let sumi = to_f32(dot32(&w, &xq[32 * at..32 * at + 32]));
                    let dx = xd[at];
                    for h in 0..2 {
                        a[h] = vaddq_f32(a[h], vmulq_f32(sumi[h], vmulq_n_f32(d[h], dx)));
                    }
                }
            }
            store(&acc, out);
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn q8_0_tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; PACK_ROWS]]) {
            scaled_blocks::<L, { 34 * PACK_ROWS }>(blk, x, lane, out, |p, w| q8_0_weights(p, w));
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn q4_0_tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; PACK_ROWS]]) {
            scaled_blocks::<L, { 18 * PACK_ROWS }>(blk, x, lane, out, |p, w| q4_0_weights(p, w));
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn q5_0_tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; PACK_ROWS]]) {
            scaled_blocks::<L, { 22 * PACK_ROWS }>(blk, x, lane, out, |p, w| q5_0_weights(p, w));
        }

        /// Q4_1 (Q8_1 activations): `acc += (d · dx) · sumi + m · s` per block.
        #[inline]
        #[target_feature(enable = $features)]
        fn q4_1_tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; PACK_ROWS]]) {
            let nb = x.cols / 32;
            let xq = &x.q[32 * nb * lane..32 * nb * (lane + L)];
            let xd = &x.d[nb * lane..nb * (lane + L)];
            let xs = &x.s[nb * lane..nb * (lane + L)];
            let mut acc = [[vdupq_n_f32(0.0); 2]; L];
            let mut w = no_weights();
            for (b, p) in blk.chunks_exact(20 * PACK_ROWS).enumerate().take(nb) {
                let (d, m) = (f16x8(p), f16x8(&p[16..]));
                nibble_weights(&p[32..], 0, &mut w);
                for (j, a) in acc.iter_mut().enumerate() {
                    let at = j * nb + b;
                    let sumi = to_f32(dot32(&w, &xq[32 * at..32 * at + 32]));
                    let (dx, s) = (xd[at], xs[at]);
                    for h in 0..2 {
                        let t = vaddq_f32(vmulq_f32(vmulq_n_f32(d[h], dx), sumi[h]), vmulq_n_f32(m[h], s));
                        a[h] = vaddq_f32(a[h], t);
                    }
                }
            }
            store(&acc, out);
        }

        crate::packed_neon_kquant::kquant_kernels!($features);
    };
}

/// The kernels with `sdot`: only where `Features::dotprod` holds (`Isa::NeonDot`).
pub(crate) mod sdot {
    neon_kernels!("neon,dotprod", sdot_quad, sdot_finish);
}

/// The kernels with `smull`: any aarch64 CPU (`Isa::Neon`).
pub(crate) mod smull {
    neon_kernels!("neon", smull_quad, smull_finish);
}
