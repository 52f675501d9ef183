//! The aarch64 kernels of [`crate::packed`]: one group of 8 interleaved rows (the layout of
//! `packed_layout.rs`, the same bytes the x86 AVX2 kernels read) against up to [`MAX_LANES`]
//! activation lanes, for Q4_1, Q8_0, Q4_0 and Q5_0 here and the K-quants in
//! `packed_neon_kquant.rs`. Each block's weights are decoded once per group and dotted with
//! every lane of a tile of up to four, either with `sdot` (dotprod) or with `smull`
//! (`packed_neon_dot.rs`).
//!
//! The integer block dots are exact and each block's scales are applied in the scalar
//! reference's order with separate multiplies and adds (no fused multiply-add), so the results
//! have exactly the bits of the row-major kernels (`matmul.rs`, `simd_neon.rs`) for every format.

use std::arch::aarch64::*;

use crate::activations::Activations;
use crate::format::WeightFormat;
use crate::packed::PACK_ROWS;
use crate::packed_neon_dot::{Quad, dot_finish, dot_quad, dot_zero, f16x8, load_rows8, load16_i8, to_f32};

/// Lanes one call handles (the caller loops over more); tiles of [`TILE_LANES`] inside.
pub(crate) const MAX_LANES: usize = 16;

/// Lanes whose sums one pass over a block's decoded weights keeps.
const TILE_LANES: usize = 4;

/// Group `blk` (one 8-row group's blocks, in `fmt`'s packed layout) against lanes
/// `lane0 .. lane0 + out.len()` of `x`, with `sdot`; only where the CPU has dotprod.
#[target_feature(enable = "neon,dotprod")]
pub(crate) fn group_sdot(fmt: WeightFormat, blk: &[u8], x: &Activations, lane0: usize, out: &mut [[f32; PACK_ROWS]]) {
    by_format::<true>(fmt, blk, x, lane0, out);
}

/// [`group_sdot`] with `smull` (any aarch64 CPU).
#[target_feature(enable = "neon")]
pub(crate) fn group_smull(fmt: WeightFormat, blk: &[u8], x: &Activations, lane0: usize, out: &mut [[f32; PACK_ROWS]]) {
    by_format::<false>(fmt, blk, x, lane0, out);
}

/// `$tile::<SDOT, L>` over `$out`'s lanes in tiles of [`TILE_LANES`], then the remainder as one
/// smaller tile.
macro_rules! in_tiles {
    ($tile:ident, $sdot:ident, $blk:expr, $x:expr, $lane0:expr, $out:expr) => {{
        let out: &mut [[f32; PACK_ROWS]] = $out;
        let mut done = 0;
        while done < out.len() {
            let n = (out.len() - done).min(TILE_LANES);
            let tile = &mut out[done..done + n];
            let lane = $lane0 + done;
            match n {
                4 => $tile::<$sdot, 4>($blk, $x, lane, tile),
                3 => $tile::<$sdot, 3>($blk, $x, lane, tile),
                2 => $tile::<$sdot, 2>($blk, $x, lane, tile),
                _ => $tile::<$sdot, 1>($blk, $x, lane, tile),
            }
            done += n;
        }
    }};
}

#[inline]
#[target_feature(enable = "neon")]
fn by_format<const SDOT: bool>(
    fmt: WeightFormat,
    blk: &[u8],
    x: &Activations,
    lane0: usize,
    out: &mut [[f32; PACK_ROWS]],
) {
    use crate::packed_neon_kquant::{q4_k_tile, q5_k_tile, q6_k_tile};
    match fmt {
        WeightFormat::Q4_1 => in_tiles!(q4_1_tile, SDOT, blk, x, lane0, out),
        WeightFormat::Q8_0 => in_tiles!(q8_0_tile, SDOT, blk, x, lane0, out),
        WeightFormat::Q4_0 => in_tiles!(q4_0_tile, SDOT, blk, x, lane0, out),
        WeightFormat::Q5_0 => in_tiles!(q5_0_tile, SDOT, blk, x, lane0, out),
        WeightFormat::Q4_K => in_tiles!(q4_k_tile, SDOT, blk, x, lane0, out),
        WeightFormat::Q5_K => in_tiles!(q5_k_tile, SDOT, blk, x, lane0, out),
        WeightFormat::Q6_K => in_tiles!(q6_k_tile, SDOT, blk, x, lane0, out),
        // `pack_in_groups` builds nothing else.
        _ => out.iter_mut().for_each(|t| t.fill(f32::NAN)),
    }
}

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

/// The 8 row sums of one 32-column block: `w[0]` holds its columns 0–15, `w[1]` 16–31, `x`
/// the block's 32 activation quants.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn dot32<const SDOT: bool>(w: &[Quad; 2], x: &[i8]) -> [int32x4_t; 2] {
    let acc = dot_quad::<SDOT>(dot_zero(), &w[0], load16_i8(x));
    dot_finish::<SDOT>(dot_quad::<SDOT>(acc, &w[1], load16_i8(&x[16..])))
}

/// Low nibbles (columns `4k ..` of a 16-byte quant layout) and high nibbles (`16 + 4k ..`) of
/// 4 packed vectors at the start of `b`, each minus `offset`.
#[inline]
#[target_feature(enable = "neon")]
fn nibble_quads(b: &[u8], offset: i8) -> [Quad; 2] {
    let mask = vdupq_n_u8(0x0F);
    let off = vdupq_n_s8(offset);
    let v: [[uint8x16_t; 2]; 4] = std::array::from_fn(|k| load_rows8(&b[32 * k..]));
    let lo = v.map(|r| r.map(|h| vsubq_s8(vreinterpretq_s8_u8(vandq_u8(h, mask)), off)));
    let hi = v.map(|r| r.map(|h| vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(h)), off)));
    [lo, hi]
}

/// A Q8_0-activation block format (Q8_0, Q4_0, Q5_0): `acc += sumi · (d · dx)` per block, as
/// `matmul::dot_row` does. `BYTES` per (group, block), f16 scales first; `decode` gives the
/// block's weights.
#[inline]
#[target_feature(enable = "neon")]
fn scaled_blocks<const SDOT: bool, const L: usize, const BYTES: usize>(
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [[f32; PACK_ROWS]],
    decode: impl Fn(&[u8]) -> [Quad; 2],
) {
    let nb = x.cols / 32;
    let xq = &x.q[32 * nb * lane..32 * nb * (lane + L)];
    let xd = &x.d[nb * lane..nb * (lane + L)];
    let mut acc = [[vdupq_n_f32(0.0); 2]; L];
    for (b, p) in blk.chunks_exact(BYTES).enumerate().take(nb) {
        let d = f16x8(p);
        let w = decode(p);
        for (j, a) in acc.iter_mut().enumerate() {
            let at = j * nb + b;
            let sumi = to_f32(dot32::<SDOT>(&w, &xq[32 * at..32 * at + 32]));
            let dx = xd[at];
            for h in 0..2 {
                a[h] = vaddq_f32(a[h], vmulq_f32(sumi[h], vmulq_n_f32(d[h], dx)));
            }
        }
    }
    store(&acc, out);
}

/// Q8_0: 8 vectors of the 32 signed quants after the scales.
#[inline]
#[target_feature(enable = "neon")]
fn q8_0_tile<const SDOT: bool, const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; PACK_ROWS]]) {
    scaled_blocks::<SDOT, L, { 34 * PACK_ROWS }>(blk, x, lane, out, |p| {
        let v: [[int8x16_t; 2]; 8] =
            std::array::from_fn(|k| load_rows8(&p[16 + 32 * k..]).map(|h| vreinterpretq_s8_u8(h)));
        [[v[0], v[1], v[2], v[3]], [v[4], v[5], v[6], v[7]]]
    });
}

/// Q4_0: nibbles minus 8.
#[inline]
#[target_feature(enable = "neon")]
fn q4_0_tile<const SDOT: bool, const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; PACK_ROWS]]) {
    scaled_blocks::<SDOT, L, { 18 * PACK_ROWS }>(blk, x, lane, out, |p| nibble_quads(&p[16..], 8));
}

/// Q5_0: nibbles with their fifth bits, minus 16. Bit `g` of the fifth-bit vector is the
/// fifth bit of column group `g` (columns `4g .. 4g + 4`).
#[inline]
#[target_feature(enable = "neon")]
fn q5_0_tile<const SDOT: bool, const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; PACK_ROWS]]) {
    scaled_blocks::<SDOT, L, { 22 * PACK_ROWS }>(blk, x, lane, out, |p| {
        let qh = load_rows8(&p[16..]);
        let [lo, hi] = nibble_quads(&p[48..], 0);
        let sixteen = vdupq_n_u8(0x10);
        let with_bit = |w: int8x16_t, h: uint8x16_t, g: u8| {
            let bit = vandq_u8(vtstq_u8(h, vdupq_n_u8(1 << g)), sixteen);
            vsubq_s8(
                vreinterpretq_s8_u8(vorrq_u8(vreinterpretq_u8_s8(w), bit)),
                vdupq_n_s8(16),
            )
        };
        let quad = |q: &Quad, first: u8| -> Quad {
            std::array::from_fn(|k| std::array::from_fn(|r| with_bit(q[k][r], qh[r], first + k as u8)))
        };
        [quad(&lo, 0), quad(&hi, 4)]
    });
}

/// Q4_1 (Q8_1 activations): `acc += (d · dx) · sumi + m · s` per block.
#[inline]
#[target_feature(enable = "neon")]
fn q4_1_tile<const SDOT: bool, const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; PACK_ROWS]]) {
    let nb = x.cols / 32;
    let xq = &x.q[32 * nb * lane..32 * nb * (lane + L)];
    let xd = &x.d[nb * lane..nb * (lane + L)];
    let xs = &x.s[nb * lane..nb * (lane + L)];
    let mut acc = [[vdupq_n_f32(0.0); 2]; L];
    for (b, p) in blk.chunks_exact(20 * PACK_ROWS).enumerate().take(nb) {
        let (d, m) = (f16x8(p), f16x8(&p[16..]));
        let w = nibble_quads(&p[32..], 0);
        for (j, a) in acc.iter_mut().enumerate() {
            let at = j * nb + b;
            let sumi = to_f32(dot32::<SDOT>(&w, &xq[32 * at..32 * at + 32]));
            let (dx, s) = (xd[at], xs[at]);
            for h in 0..2 {
                let t = vaddq_f32(vmulq_f32(vmulq_n_f32(d[h], dx), sumi[h]), vmulq_n_f32(m[h], s));
                a[h] = vaddq_f32(a[h], t);
            }
        }
    }
    store(&acc, out);
}
