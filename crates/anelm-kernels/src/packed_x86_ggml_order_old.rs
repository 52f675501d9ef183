//! The packed Q4_0 and Q5_0 kernels (layouts in `packed_layout.rs`): 8-row groups on AVX2 and
//! AVX-512 VNNI (ymm), 16-row groups on AVX-512 VNNI (zmm), all **accumulating in ggml's AVX2
//! order**, so their results are bit-identical to
//! the row-major tile's (`simd_x86::dot_rows4`), which follows llama.cpp.
//!
//! That order keeps, per row, eight f32 partial sums: partial `k` gathers, block after block,
//! `(Σ of the products of elements 4k .. 4k+4) · (d·dx)` by FMA, and the eight are added at the
//! end as `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`. A packed vector `k` holds exactly elements
//! `4k .. 4k+4` of the 8 rows, so one `vpdpbusd` yields partial `k`'s integer for all 8 rows and
//! the same FMA follows row-wise. Why not one f32 sum per block (a third of the FMAs): that
//! order moved Gemma 3's greedy output at one of llama.cpp's near-ties (docs/field-guide.md,
//! 2026-12-03, second pass, item 10), and this one cannot.
//!
//! The weights are read unsigned (Q4_0's nibble, Q5_0's nibble plus fifth bit), without the
//! format's offset of 8 or 16; each 4-product sum starts at `−offset·Σ` of its 4 activations
//! (`Activations::quad_offsets`, a broadcast load), so it comes out exact.

use std::arch::x86_64::*;

use crate::activations::Activations;
use crate::packed_x86::{LaneBlocks, PREFETCH, acc_dot, acc_dot_vnni, f16x8, lane_entry};
use crate::packed_x86_wide::{WIDE_ROWS, f16x16, load512, prefetch_ahead, weight_prefetch_nta};
use crate::simd_x86::load256;

macro_rules! define_group {
    ($entry:ident, $tile:ident, $features:literal, $dot:ident, $wide:literal, $fifth:literal) => {
        lane_entry!($entry, $tile, $features, $wide);

        #[inline]
        #[target_feature(enable = $features)]
        #[allow(clippy::needless_range_loop)] // `j` indexes the accumulators and the lanes alike
        fn $tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; 8]]) {
            // Bytes per (group, block) and where the quant bytes start (after the scales and,
            // for Q5_0, the fifth bits).
            const BYTES: usize = if $fifth { 176 } else { 144 };
            const QS: usize = if $fifth { 48 } else { 16 };
            let nb = x.cols / 32;
            let xq = LaneBlocks::new(&x.q, lane, L, x.cols);
            let xd = LaneBlocks::new(&x.d, lane, L, nb);
            let xo = LaneBlocks::new(&x.quad_offsets, lane, L, 8 * nb);
            let (mask, five) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
            let mut acc = [[_mm256_setzero_ps(); 8]; L];
            for (b, p) in blk.chunks_exact(BYTES).enumerate().take(nb) {
                for ahead in (0..BYTES).step_by(64) {
                    // A prefetch never faults, so the address may lie past the group's end.
                    _mm_prefetch::<_MM_HINT_T0>(p.as_ptr().wrapping_add(PREFETCH + ahead).cast());
                }
                let d = f16x8(&p[0..16]);
                let ddx: [__m256; L] = std::array::from_fn(|j| _mm256_mul_ps(d, _mm256_set1_ps(xd.get(j, b))));
                let fifth_bits = if $fifth {
                    load256(&p[16..48])
                } else {
                    _mm256_setzero_si256()
                };
                for k in 0..8 {
                    let v = load256(&p[QS + 32 * (k % 4)..]);
                    let mut w = if k < 4 {
                        _mm256_and_si256(v, mask)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask)
                    };
                    if $fifth {
                        // Bit k of each byte to bit 4 (16-bit shifts: what crosses into the
                        // neighbouring byte lands outside bit 4 and is masked off).
                        let h = match k {
                            0 => _mm256_slli_epi16::<4>(fifth_bits),
                            1 => _mm256_slli_epi16::<3>(fifth_bits),
                            2 => _mm256_slli_epi16::<2>(fifth_bits),
                            3 => _mm256_slli_epi16::<1>(fifth_bits),
                            4 => fifth_bits,
                            5 => _mm256_srli_epi16::<1>(fifth_bits),
                            6 => _mm256_srli_epi16::<2>(fifth_bits),
                            _ => _mm256_srli_epi16::<3>(fifth_bits),
                        };
                        w = _mm256_or_si256(w, _mm256_and_si256(h, five));
                    }
                    for j in 0..L {
                        let start = _mm256_set1_epi32(xo.get(j, 8 * b + k));
                        let sum = $dot(start, w, _mm256_set1_epi32(xq.quad(j, 32 * b + 4 * k)));
                        acc[j][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), ddx[j], acc[j][k]);
                    }
                }
            }
            for j in 0..L {
                let a = &acc[j];
                let lo = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
                let hi = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
                // `+ 0.0` as the row-major tile adds its (zero) minimum term: −0.0 becomes +0.0.
                let sum = _mm256_add_ps(_mm256_add_ps(lo, hi), _mm256_setzero_ps());
                // SAFETY: `out[j]` holds exactly 8 f32; unaligned store.
                unsafe { _mm256_storeu_ps(out[j].as_mut_ptr(), sum) };
            }
        }
    };
}

// 8 accumulators per lane: one lane per tile on AVX2's 16 registers, two with AVX-512VL's 32.
define_group!(q4_0_group, q4_0_tile, "avx2,fma,f16c", acc_dot, 1, false);
define_group!(
    q4_0_group_vnni,
    q4_0_tile_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    acc_dot_vnni,
    2,
    false
);
define_group!(q5_0_group, q5_0_tile, "avx2,fma,f16c", acc_dot, 1, true);
define_group!(
    q5_0_group_vnni,
    q5_0_tile_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    acc_dot_vnni,
    2,
    true
);

/// The 16-row form: the same arithmetic on zmm registers, 16 rows per `vpdpbusd`, so a row's
/// values are bit-identical to the 8-row kernels' (and the row-major tile's).
macro_rules! define_wide_group {
    ($entry:ident, $tile:ident, $fifth:literal) => {
        #[doc = "`out[l][r] = row r of the 16-row group · x[lane0 + l]` for `l < out.len() ≤ MAX_LANES`."]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) fn $entry(blk: &[u8], x: &Activations, lane0: usize, out: &mut [[f32; WIDE_ROWS]]) {
            // Two lanes per tile: 16 accumulators, their two scale vectors, the weight vector
            // and the broadcasts fit the 32 zmm registers.
            let n = out.len();
            let nta = weight_prefetch_nta();
            let mut l = 0;
            while l < n {
                let m = (n - l).min(2);
                let tile = &mut out[l..l + m];
                match (m, nta) {
                    (2, true) => $tile::<2, true>(blk, x, lane0 + l, tile),
                    (2, false) => $tile::<2, false>(blk, x, lane0 + l, tile),
                    (_, true) => $tile::<1, true>(blk, x, lane0 + l, tile),
                    (_, false) => $tile::<1, false>(blk, x, lane0 + l, tile),
                }
                l += m;
            }
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        #[allow(clippy::needless_range_loop)] // `j` indexes the accumulators and the lanes alike
        fn $tile<const L: usize, const NTA: bool>(
            blk: &[u8],
            x: &Activations,
            lane: usize,
            out: &mut [[f32; WIDE_ROWS]],
        ) {
            const BYTES: usize = if $fifth { 352 } else { 288 };
            const QS: usize = if $fifth { 96 } else { 32 };
            let nb = x.cols / 32;
            let xq = LaneBlocks::new(&x.q, lane, L, x.cols);
            let xd = LaneBlocks::new(&x.d, lane, L, nb);
            let xo = LaneBlocks::new(&x.quad_offsets, lane, L, 8 * nb);
            let (mask, five) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10));
            let mut acc = [[_mm512_setzero_ps(); 8]; L];
            for (b, p) in blk.chunks_exact(BYTES).enumerate().take(nb) {
                prefetch_ahead::<NTA>(p, BYTES.div_ceil(64));
                let d = f16x16(&p[0..32]);
                let mut ddx = [_mm512_setzero_ps(); L];
                for j in 0..L {
                    ddx[j] = _mm512_mul_ps(d, _mm512_set1_ps(xd.get(j, b)));
                }
                let fifth_bits = if $fifth {
                    load512(&p[32..96])
                } else {
                    _mm512_setzero_si512()
                };
                for k in 0..8 {
                    let v = load512(&p[QS + 64 * (k % 4)..]);
                    let mut w = if k < 4 {
                        _mm512_and_si512(v, mask)
                    } else {
                        _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask)
                    };
                    if $fifth {
                        let h = match k {
                            0 => _mm512_slli_epi16::<4>(fifth_bits),
                            1 => _mm512_slli_epi16::<3>(fifth_bits),
                            2 => _mm512_slli_epi16::<2>(fifth_bits),
                            3 => _mm512_slli_epi16::<1>(fifth_bits),
                            4 => fifth_bits,
                            5 => _mm512_srli_epi16::<1>(fifth_bits),
                            6 => _mm512_srli_epi16::<2>(fifth_bits),
                            _ => _mm512_srli_epi16::<3>(fifth_bits),
                        };
                        w = _mm512_or_si512(w, _mm512_and_si512(h, five));
                    }
                    for j in 0..L {
                        let start = _mm512_set1_epi32(xo.get(j, 8 * b + k));
                        let sum = _mm512_dpbusd_epi32(start, w, _mm512_set1_epi32(xq.quad(j, 32 * b + 4 * k)));
                        acc[j][k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), ddx[j], acc[j][k]);
                    }
                }
            }
            for j in 0..L {
                let a = &acc[j];
                let lo = _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6]));
                let hi = _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]));
                let sum = _mm512_add_ps(_mm512_add_ps(lo, hi), _mm512_setzero_ps());
                // SAFETY: `out[j]` holds exactly 16 f32; unaligned store.
                unsafe { _mm512_storeu_ps(out[j].as_mut_ptr(), sum) };
            }
        }
    };
}

define_wide_group!(q4_0_group_wide, q4_0_tile_wide, false);
define_wide_group!(q5_0_group_wide, q5_0_tile_wide, true);
