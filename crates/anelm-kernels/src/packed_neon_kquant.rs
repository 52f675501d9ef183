//! The aarch64 packed kernels of the K-quants (Q4_K, Q5_K, Q6_K; 256-element super-blocks and
//! Q8_K activations), in the 8-row layouts of `packed_layout.rs`. Per super-block and lane each
//! row's sub-block dots are weighted by their scales into one exact integer (and Q4_K/Q5_K's
//! minimums against the activations' 16-value sums into another), then scaled in f32 in the
//! scalar reference's order, so the results have the row-major kernels' bits.

use std::arch::aarch64::*;

use crate::activations::Activations;
use crate::packed::PACK_ROWS;
use crate::packed_neon::{dot32, store};
use crate::packed_neon_dot::{
    Quad, bytes8_to_i32, dot_finish, dot_quad, dot_zero, f16x8, load_rows8, load16_i8, to_f32,
};

/// Per-lane views of the Q8_K activations of lanes `lane .. lane + lanes`.
struct Q8kLanes<'a> {
    q: &'a [i8],
    d: &'a [f32],
    bsums: &'a [i32],
    nb: usize,
}

impl<'a> Q8kLanes<'a> {
    #[inline]
    fn new(x: &'a Activations, lane: usize, lanes: usize) -> Self {
        let nb = x.cols / 256;
        Self {
            q: &x.q[256 * nb * lane..256 * nb * (lane + lanes)],
            d: &x.d[nb * lane..nb * (lane + lanes)],
            bsums: &x.bsums[16 * nb * lane..16 * nb * (lane + lanes)],
            nb,
        }
    }

    /// Super-block `b` of lane `j` (relative): its 256 quants.
    #[inline]
    fn quants(&self, j: usize, b: usize) -> &[i8] {
        let at = j * self.nb + b;
        &self.q[256 * at..256 * at + 256]
    }
}

/// `acc += sc · dot` for the 8 rows.
#[inline]
#[target_feature(enable = "neon")]
fn add_scaled(acc: &mut [int32x4_t; 2], sc: &[int32x4_t; 2], dot: [int32x4_t; 2]) {
    for h in 0..2 {
        acc[h] = vmlaq_s32(acc[h], sc[h], dot[h]);
    }
}

/// Q4_K and Q5_K: 8 sub-blocks of 32; `acc += (d · dx) · sumi − (dmin · dx) · summins`.
/// `FIFTH`: Q5_K, whose fifth bits follow the Q4_K layout.
#[inline]
#[target_feature(enable = "neon")]
fn k4_tile<const SDOT: bool, const L: usize, const BYTES: usize, const FIFTH: bool>(
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [[f32; PACK_ROWS]],
) {
    let xs = Q8kLanes::new(x, lane, L);
    let mut acc = [[vdupq_n_f32(0.0); 2]; L];
    let mask = vdupq_n_u8(0x0F);
    for (b, p) in blk.chunks_exact(BYTES).enumerate().take(xs.nb) {
        let (d, dmin) = (f16x8(p), f16x8(&p[16..]));
        // Σ_j m[j] · (bsums[2j] + bsums[2j + 1]) per lane: the minimums, pair after pair.
        let mut summins = [[vdupq_n_s32(0); 2]; L];
        for pair in 0..4 {
            let at = 96 + 16 * pair;
            // SAFETY: `at + 16 ≤ 160 ≤ BYTES`, inside this block's chunk; `ld2` (de-interleaving
            // each row's two minimums) has no alignment requirement.
            let m = unsafe { vld2_u8(p[at..at + 16].as_ptr()) };
            for (i, mv) in [m.0, m.1].into_iter().enumerate() {
                let wide = vreinterpretq_s16_u16(vmovl_u8(mv));
                let mn = [vmovl_s16(vget_low_s16(wide)), vmovl_high_s16(wide)];
                let sub = 2 * pair + i;
                for (j, s) in summins.iter_mut().enumerate() {
                    let bs = &xs.bsums[16 * (j * xs.nb + b)..];
                    let pair_sum = bs[2 * sub] + bs[2 * sub + 1];
                    for h in 0..2 {
                        s[h] = vmlaq_n_s32(s[h], mn[h], pair_sum);
                    }
                }
            }
        }
        let mut sumi = [[vdupq_n_s32(0); 2]; L];
        for sub in 0..8 {
            let (chunk, high) = (sub / 2, sub % 2 == 1);
            let sc = bytes8_to_i32(&p[32 + 8 * sub..], false);
            let w: [[int8x16_t; 2]; 8] = std::array::from_fn(|k| {
                let v = load_rows8(&p[160 + 32 * (8 * chunk + k)..]);
                let bits = if FIFTH {
                    // Bit `sub` of `qh` vector `k`: the fifth bit of these 4 columns, as 16.
                    let qh = load_rows8(&p[148 * PACK_ROWS + 32 * k..]);
                    qh.map(|h| vandq_u8(vtstq_u8(h, vdupq_n_u8(1 << sub)), vdupq_n_u8(0x10)))
                } else {
                    [vdupq_n_u8(0); 2]
                };
                std::array::from_fn(|r| {
                    let nib = if high {
                        vshrq_n_u8::<4>(v[r])
                    } else {
                        vandq_u8(v[r], mask)
                    };
                    let q = if FIFTH { vorrq_u8(nib, bits[r]) } else { nib };
                    vreinterpretq_s8_u8(q)
                })
            });
            let quads: [Quad; 2] = [[w[0], w[1], w[2], w[3]], [w[4], w[5], w[6], w[7]]];
            for (j, s) in sumi.iter_mut().enumerate() {
                let dot = dot32::<SDOT>(&quads, &xs.quants(j, b)[32 * sub..32 * sub + 32]);
                add_scaled(s, &sc, dot);
            }
        }
        for (j, a) in acc.iter_mut().enumerate() {
            let dx = xs.d[j * xs.nb + b];
            let (si, sm) = (to_f32(sumi[j]), to_f32(summins[j]));
            for h in 0..2 {
                let plus = vmulq_f32(vmulq_n_f32(d[h], dx), si[h]);
                let minus = vmulq_f32(vmulq_n_f32(dmin[h], dx), sm[h]);
                a[h] = vaddq_f32(a[h], vsubq_f32(plus, minus));
            }
        }
    }
    store(&acc, out);
}

/// Q4_K's kernel: one tile of `L` lanes (see `packed_neon::in_tiles`).
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn q4_k_tile<const SDOT: bool, const L: usize>(
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [[f32; PACK_ROWS]],
) {
    k4_tile::<SDOT, L, { 148 * PACK_ROWS }, false>(blk, x, lane, out);
}

/// Q5_K's kernel: one tile of `L` lanes.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn q5_k_tile<const SDOT: bool, const L: usize>(
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [[f32; PACK_ROWS]],
) {
    k4_tile::<SDOT, L, { 180 * PACK_ROWS }, true>(blk, x, lane, out);
}

/// Q6_K: 16 sub-blocks of 16, signed scales; `acc += (d · dx) · sumi`. One tile of `L` lanes.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn q6_k_tile<const SDOT: bool, const L: usize>(
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [[f32; PACK_ROWS]],
) {
    const R: usize = PACK_ROWS;
    let xs = Q8kLanes::new(x, lane, L);
    let mut acc = [[vdupq_n_f32(0.0); 2]; L];
    let (mask, three, thirty_two) = (vdupq_n_u8(0x0F), vdupq_n_u8(3), vdupq_n_s8(32));
    for (b, p) in blk.chunks_exact(210 * R).enumerate().take(xs.nb) {
        let d = f16x8(p);
        let mut sumi = [[vdupq_n_s32(0); 2]; L];
        for half in 0..2 {
            let qh: [[uint8x16_t; 2]; 8] = std::array::from_fn(|k| load_rows8(&p[146 * R + 32 * (8 * half + k)..]));
            // Quarter `qq` (columns `128·half + 32·qq ..`): `ql` part `qq & 1`, high nibbles
            // from `qq = 2`, `qh` bits `2·qq ..`; sub-blocks `8·half + 2·qq` and the next.
            for qq in 0..4 {
                let part = 2 * half + (qq & 1);
                let w: [[int8x16_t; 2]; 8] = std::array::from_fn(|k| {
                    let v = load_rows8(&p[18 * R + 32 * (8 * part + k)..]);
                    std::array::from_fn(|r| {
                        let nib = if qq >= 2 {
                            vshrq_n_u8::<4>(v[r])
                        } else {
                            vandq_u8(v[r], mask)
                        };
                        let top = vandq_u8(shift_right(qh[k][r], 2 * qq), three);
                        let q = vorrq_u8(nib, vshlq_n_u8::<4>(top));
                        vsubq_s8(vreinterpretq_s8_u8(q), thirty_two)
                    })
                });
                let sub = 8 * half + 2 * qq;
                let sc = [
                    bytes8_to_i32(&p[2 * R + R * sub..], true),
                    bytes8_to_i32(&p[2 * R + R * (sub + 1)..], true),
                ];
                let quads: [Quad; 2] = [[w[0], w[1], w[2], w[3]], [w[4], w[5], w[6], w[7]]];
                for (j, s) in sumi.iter_mut().enumerate() {
                    let xq = &xs.quants(j, b)[128 * half + 32 * qq..];
                    for (i, quad) in quads.iter().enumerate() {
                        let dot = dot_finish::<SDOT>(dot_quad::<SDOT>(dot_zero(), quad, load16_i8(&xq[16 * i..])));
                        add_scaled(s, &sc[i], dot);
                    }
                }
            }
        }
        for (j, a) in acc.iter_mut().enumerate() {
            let dx = xs.d[j * xs.nb + b];
            let si = to_f32(sumi[j]);
            for h in 0..2 {
                a[h] = vaddq_f32(a[h], vmulq_f32(vmulq_n_f32(d[h], dx), si[h]));
            }
        }
    }
    store(&acc, out);
}

/// `v >> n` per byte for `n ∈ {0, 2, 4, 6}` (the shift of an intrinsic must be a constant).
#[inline]
#[target_feature(enable = "neon")]
fn shift_right(v: uint8x16_t, n: usize) -> uint8x16_t {
    match n {
        0 => v,
        2 => vshrq_n_u8::<2>(v),
        4 => vshrq_n_u8::<4>(v),
        _ => vshrq_n_u8::<6>(v),
    }
}
