//! The aarch64 packed kernels of the K-quants (Q4_K, Q5_K, Q6_K, and Q3_K and IQ4_XS;
//! 256-element super-blocks and Q8_K activations), in the 8-row layouts of `packed_layout.rs`. Per super-block and lane each
//! row's sub-block dots are weighted by their scales into one exact integer (and Q4_K/Q5_K's
//! minimums against the activations' 16-value sums into another), then scaled in f32 in the
//! scalar reference's order, so the results have the row-major kernels' bits.
//!
//! [`kquant_kernels`] expands inside each of `packed_neon`'s two kernel sets (`sdot`, `smull`),
//! where `dot32`, `dot16` and the target features come from.

use std::arch::aarch64::*;

use crate::activations::Activations;

/// Per-lane views of the Q8_K activations of lanes `lane .. lane + lanes`.
pub(crate) struct Q8kLanes<'a> {
    q: &'a [i8],
    /// Each super-block's scale.
    pub(crate) d: &'a [f32],
    bsums: &'a [i32],
    /// Super-blocks per lane.
    pub(crate) nb: usize,
}

impl<'a> Q8kLanes<'a> {
    #[inline]
    pub(crate) fn new(x: &'a Activations, lane: usize, lanes: usize) -> Self {
        let nb = x.cols / 256;
        Self {
            q: &x.q[256 * nb * lane..256 * nb * (lane + lanes)],
            d: &x.d[nb * lane..nb * (lane + lanes)],
            bsums: &x.bsums[16 * nb * lane..16 * nb * (lane + lanes)],
            nb,
        }
    }

    /// Super-block `b` of lane `j` (counted from `lane`): its 256 quants.
    #[inline]
    pub(crate) fn quants(&self, j: usize, b: usize) -> &[i8] {
        let at = j * self.nb + b;
        &self.q[256 * at..256 * at + 256]
    }

    /// Super-block `b` of lane `j`: the sum of 32-value sub-block `sub`'s quants.
    #[inline]
    pub(crate) fn sub_sum(&self, j: usize, b: usize, sub: usize) -> i32 {
        let at = 16 * (j * self.nb + b) + 2 * sub;
        self.bsums[at] + self.bsums[at + 1]
    }
}

/// `acc += sc · dot` for the 8 rows.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn add_scaled(acc: &mut [int32x4_t; 2], sc: &[int32x4_t; 2], dot: [int32x4_t; 2]) {
    for h in 0..2 {
        acc[h] = vmlaq_s32(acc[h], sc[h], dot[h]);
    }
}

/// Per lane, Σ_j m[j] · (sum of sub-block j's activations) for the 8 rows of one Q4_K/Q5_K
/// (group, super-block) `p`, whose minimums sit in pairs at bytes 96.. (`packed_layout.rs`).
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn min_sums<const L: usize>(p: &[u8], xs: &Q8kLanes<'_>, b: usize) -> [[int32x4_t; 2]; L] {
    let mut sums = [[vdupq_n_s32(0); 2]; L];
    let pairs = &p[96..160];
    for (pair, bytes) in pairs.chunks_exact(16).enumerate() {
        // SAFETY: `bytes` holds exactly 16 bytes; `ld2` (de-interleaving each row's two
        // minimums) has no alignment requirement.
        let m = unsafe { vld2_u8(bytes.as_ptr()) };
        for (i, mv) in [m.0, m.1].into_iter().enumerate() {
            let wide = vreinterpretq_s16_u16(vmovl_u8(mv));
            let mn = [vmovl_s16(vget_low_s16(wide)), vmovl_high_s16(wide)];
            for (j, s) in sums.iter_mut().enumerate() {
                let a = xs.sub_sum(j, b, 2 * pair + i);
                for h in 0..2 {
                    s[h] = vmlaq_n_s32(s[h], mn[h], a);
                }
            }
        }
    }
    sums
}

/// `v >> n` per byte for `n ∈ {0, 2, 4, 6}` (the shift of an intrinsic must be a constant).
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn shift_right(v: uint8x16_t, n: usize) -> uint8x16_t {
    match n {
        0 => v,
        2 => vshrq_n_u8::<2>(v),
        4 => vshrq_n_u8::<4>(v),
        _ => vshrq_n_u8::<6>(v),
    }
}

/// The K-quant tiles (`q4_k_tile`, `q5_k_tile`, `q6_k_tile`), compiled for `$features`, in the
/// module of a `packed_neon` kernel set.
macro_rules! kquant_kernels {
    ($features:literal) => {
        use crate::packed_neon_dot::{bytes8_to_i32, load_rows8};
        use crate::packed_neon_kquant::{Q8kLanes, add_scaled, min_sums, shift_right};

        /// Q4_K and Q5_K: 8 sub-blocks of 32; `acc += (d · dx) · sumi − (dmin · dx) · summins`.
        /// `FIFTH`: Q5_K, whose fifth bits follow the Q4_K layout.
        #[inline]
        #[target_feature(enable = $features)]
        fn k4_tile<const L: usize, const BYTES: usize, const FIFTH: bool>(
            blk: &[u8],
            x: &Activations,
            lane: usize,
            out: &mut [[f32; PACK_ROWS]],
        ) {
            let xs = Q8kLanes::new(x, lane, L);
            let mut acc = [[vdupq_n_f32(0.0); 2]; L];
            let (mask, sixteen) = (vdupq_n_u8(0x0F), vdupq_n_u8(0x10));
            let mut w = no_weights();
            for (b, p) in blk.chunks_exact(BYTES).enumerate().take(xs.nb) {
                let (d, dmin) = (f16x8(p), f16x8(&p[16..]));
                let summins = min_sums::<L>(p, &xs, b);
                let mut sumi = [[vdupq_n_s32(0); 2]; L];
                for sub in 0..8 {
                    let (chunk, high) = (sub / 2, sub % 2 == 1);
                    let sc = bytes8_to_i32(&p[32 + 8 * sub..], false);
                    let bit = vdupq_n_u8(1 << sub);
                    for (k, wk) in w.as_flattened_mut().iter_mut().enumerate() {
                        let v = load_rows8(&p[160 + 32 * (8 * chunk + k)..]);
                        // Q5_K: bit `sub` of `qh` vector `k` is these columns' fifth bit.
                        let qh = if FIFTH {
                            load_rows8(&p[148 * PACK_ROWS + 32 * k..])
                        } else {
                            [vdupq_n_u8(0); 2]
                        };
                        for ((dst, v), h) in wk.iter_mut().zip(v).zip(qh) {
                            let nib = if high {
                                vshrq_n_u8::<4>(v)
                            } else {
                                vandq_u8(v, mask)
                            };
                            let q = if FIFTH {
                                vorrq_u8(nib, vandq_u8(vtstq_u8(h, bit), sixteen))
                            } else {
                                nib
                            };
                            *dst = vreinterpretq_s8_u8(q);
                        }
                    }
                    for (j, s) in sumi.iter_mut().enumerate() {
                        let dot = dot32(&w, &xs.quants(j, b)[32 * sub..32 * sub + 32]);
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

        #[inline]
        #[target_feature(enable = $features)]
        fn q4_k_tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; PACK_ROWS]]) {
            k4_tile::<L, { 148 * PACK_ROWS }, false>(blk, x, lane, out);
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn q5_k_tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; PACK_ROWS]]) {
            k4_tile::<L, { 180 * PACK_ROWS }, true>(blk, x, lane, out);
        }

        /// Q6_K: 16 sub-blocks of 16, signed scales; `acc += (d · dx) · sumi`.
        #[inline]
        #[target_feature(enable = $features)]
        fn q6_k_tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; PACK_ROWS]]) {
            const R: usize = PACK_ROWS;
            let xs = Q8kLanes::new(x, lane, L);
            let mut acc = [[vdupq_n_f32(0.0); 2]; L];
            let (mask, three, thirty_two) = (vdupq_n_u8(0x0F), vdupq_n_u8(3), vdupq_n_s8(32));
            let mut w = no_weights();
            for (b, p) in blk.chunks_exact(210 * R).enumerate().take(xs.nb) {
                let d = f16x8(p);
                let mut sumi = [[vdupq_n_s32(0); 2]; L];
                // Quarter `qq` of half `half` (columns `128·half + 32·qq ..`): `ql` part
                // `qq & 1`, high nibbles from `qq = 2`, `qh` bits `2·qq ..`; sub-blocks
                // `8·half + 2·qq` and the next.
                for half in 0..2 {
                    for qq in 0..4 {
                        let part = 2 * half + (qq & 1);
                        for (k, wk) in w.as_flattened_mut().iter_mut().enumerate() {
                            let v = load_rows8(&p[18 * R + 32 * (8 * part + k)..]);
                            let qh = load_rows8(&p[146 * R + 32 * (8 * half + k)..]);
                            for ((dst, v), h) in wk.iter_mut().zip(v).zip(qh) {
                                let nib = if qq >= 2 {
                                    vshrq_n_u8::<4>(v)
                                } else {
                                    vandq_u8(v, mask)
                                };
                                let top = vandq_u8(shift_right(h, 2 * qq), three);
                                let q = vorrq_u8(nib, vshlq_n_u8::<4>(top));
                                *dst = vsubq_s8(vreinterpretq_s8_u8(q), thirty_two);
                            }
                        }
                        let sub = 8 * half + 2 * qq;
                        let sc = [
                            bytes8_to_i32(&p[2 * R + R * sub..], true),
                            bytes8_to_i32(&p[2 * R + R * (sub + 1)..], true),
                        ];
                        for (j, s) in sumi.iter_mut().enumerate() {
                            let xq = &xs.quants(j, b)[128 * half + 32 * qq..];
                            add_scaled(s, &sc[0], dot16(&w[0], xq));
                            add_scaled(s, &sc[1], dot16(&w[1], &xq[16..]));
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

        /// Q3_K: 16 sub-blocks of 16, signed scales, weights `low | high << 2` minus 4 (the
        /// layout's `qs` crumbs and `hmask` bits); `acc += (d · dx) · sumi`.
        #[inline]
        #[target_feature(enable = $features)]
        fn q3_k_tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; PACK_ROWS]]) {
            const R: usize = PACK_ROWS;
            let xs = Q8kLanes::new(x, lane, L);
            let mut acc = [[vdupq_n_f32(0.0); 2]; L];
            let (three, four) = (vdupq_n_u8(3), vdupq_n_u8(4));
            let mut w = no_weights();
            for (b, p) in blk
                .chunks_exact(crate::packed_layout::Q3_K_ROW_BLOCK * R)
                .enumerate()
                .take(xs.nb)
            {
                let d = f16x8(p);
                let mut sumi = [[vdupq_n_s32(0); 2]; L];
                // Crumb `j` of `qs` half `n`: columns `128n + 32j ..+32`, sub-blocks `8n + 2j`
                // (`w[0]`, vectors 0–3) and the next (`w[1]`, vectors 4–7); their high bits are
                // bit `4n + j` of the `hmask` vectors.
                for n in 0..2 {
                    for j in 0..4 {
                        let bit = vdupq_n_u8(1 << (4 * n + j));
                        for (v, wk) in w.as_flattened_mut().iter_mut().enumerate() {
                            let qs = load_rows8(&p[18 * R + 32 * (8 * n + v)..]);
                            let hm = load_rows8(&p[82 * R + 32 * v..]);
                            for ((dst, q), h) in wk.iter_mut().zip(qs).zip(hm) {
                                let low = vandq_u8(shift_right(q, 2 * j), three);
                                let u = vorrq_u8(low, vandq_u8(vtstq_u8(h, bit), four));
                                *dst = vreinterpretq_s8_u8(vsubq_u8(u, four));
                            }
                        }
                        let sub = 8 * n + 2 * j;
                        let sc = [
                            bytes8_to_i32(&p[2 * R + R * sub..], true),
                            bytes8_to_i32(&p[2 * R + R * (sub + 1)..], true),
                        ];
                        for (l, s) in sumi.iter_mut().enumerate() {
                            let xq = &xs.quants(l, b)[128 * n + 32 * j..];
                            add_scaled(s, &sc[0], dot16(&w[0], xq));
                            add_scaled(s, &sc[1], dot16(&w[1], &xq[16..]));
                        }
                    }
                }
                for (l, a) in acc.iter_mut().enumerate() {
                    let dx = xs.d[l * xs.nb + b];
                    let si = to_f32(sumi[l]);
                    for h in 0..2 {
                        a[h] = vaddq_f32(a[h], vmulq_f32(vmulq_n_f32(d[h], dx), si[h]));
                    }
                }
            }
            store(&acc, out);
        }

        /// IQ4_XS: 8 sub-blocks of 32, signed scales, weights IQ4_NL's levels of the nibbles
        /// (one table lookup per register); `acc += (d · dx) · sumi`.
        #[inline]
        #[target_feature(enable = $features)]
        fn iq4_xs_tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; PACK_ROWS]]) {
            const R: usize = PACK_ROWS;
            let xs = Q8kLanes::new(x, lane, L);
            let table = load16_i8(&crate::blocks::IQ4_NL_VALUES);
            let mut acc = [[vdupq_n_f32(0.0); 2]; L];
            let mut w = no_weights();
            for (b, p) in blk
                .chunks_exact(crate::packed_layout::IQ4_XS_ROW_BLOCK * R)
                .enumerate()
                .take(xs.nb)
            {
                let d = f16x8(p);
                let mut sumi = [[vdupq_n_s32(0); 2]; L];
                for sub in 0..8 {
                    // Columns `32·sub ..`: low nibbles of vectors `4·sub ..+4` (`w[0]`), high
                    // nibbles (`w[1]`), as indices; then their levels.
                    nibble_weights(&p[10 * R + 128 * sub..], 0, &mut w);
                    for wk in w.as_flattened_mut() {
                        for v in wk.iter_mut() {
                            *v = vqtbl1q_s8(table, vreinterpretq_u8_s8(*v));
                        }
                    }
                    let sc = bytes8_to_i32(&p[2 * R + R * sub..], true);
                    for (l, s) in sumi.iter_mut().enumerate() {
                        add_scaled(s, &sc, dot32(&w, &xs.quants(l, b)[32 * sub..32 * sub + 32]));
                    }
                }
                for (l, a) in acc.iter_mut().enumerate() {
                    let dx = xs.d[l * xs.nb + b];
                    let si = to_f32(sumi[l]);
                    for h in 0..2 {
                        a[h] = vaddq_f32(a[h], vmulq_f32(vmulq_n_f32(d[h], dx), si[h]));
                    }
                }
            }
            store(&acc, out);
        }
    };
}
pub(crate) use kquant_kernels;
