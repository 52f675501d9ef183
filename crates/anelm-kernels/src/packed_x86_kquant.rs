//! The packed Q4_K, Q5_K and Q6_K kernels (layouts in `packed_layout.rs`): 8-row groups on AVX2
//! (`maddubs` + `madd`) and AVX-512 VNNI (`vpdpbusd` on ymm registers), 16-row groups on
//! AVX-512 VNNI (zmm registers).
//!
//! **Bit-exact with the row-major kernels** (scalar and SIMD alike): those reduce each 256-value
//! super-block to exact integers — `Σ_j scale_j · (sub-block dot)`, and for Q4_K
//! `Σ_j min_j · (sub-block Σx)` — then add `d·dx·sumi − dmin·dx·summins` to the row's f32 sum,
//! super-block after super-block. Here the same integers come out of vector arithmetic for 8
//! rows at once (every partial sum fits an i32, so their order does not matter), and the same
//! f32 operations follow in the same order, separately rounded (no FMA).
//!
//! The weights are read unsigned: Q4_K's nibbles are already, and Q6_K's 6-bit values are taken
//! without their offset of 32, which each sub-block sum gets back by starting at
//! `−32·Σx` (`Activations::sub_offsets`, a broadcast load).

use std::arch::x86_64::*;

use crate::activations::Activations;
use crate::packed_x86::{LaneBlocks, acc_dot, acc_dot_vnni, f16x8, lane_entry};
use crate::packed_x86_wide::{WIDE_ROWS, f16x16, load512, prefetch_part_ahead, weight_prefetch_nta};
use crate::simd_x86::load256;

/// Bytes per row of a Q4_K super-block in the packed layout (Q5_K: 32 more, its fifth bits).
const Q4_K_ROW_BYTES: usize = 148;
/// Where a group's fifth bits start in the Q5_K layout, per row of the group.
const Q5_K_HIGH_BITS: usize = 148;
/// Bytes of one 8-row group's Q6_K super-block (210 per row).
const Q6_K_GROUP_BYTES: usize = 8 * 210;
/// Bytes of one 16-row group's Q6_K super-block.
const Q6_K_WIDE_BYTES: usize = 16 * 210;

/// 8 bytes at `b` widened to the 8 rows' i32 (unsigned, or signed when `SIGNED`).
#[inline]
#[target_feature(enable = "avx2")]
fn bytes_to_i32<const SIGNED: bool>(b: &[u8]) -> __m256i {
    assert!(b.len() >= 8);
    // SAFETY: the assertion guarantees 8 readable bytes; an unaligned 64-bit load.
    let v = unsafe { _mm_loadl_epi64(b.as_ptr().cast()) };
    if SIGNED {
        _mm256_cvtepi8_epi32(v)
    } else {
        _mm256_cvtepu8_epi32(v)
    }
}

/// Q4_K, or with `$fifth` Q5_K (the same layout plus, at `148R`, for `k < 8` bytes `4k .. +4`
/// of each row's 32 `qh` bytes: bit `2c + half` of a byte is the fifth bit of the value that
/// vector `k` of chunk `c` holds at that byte, low nibbles for `half` 0, high for 1).
macro_rules! define_q4_k_group {
    ($entry:ident, $tile:ident, $features:literal, $dot:ident, $wide:literal, $fifth:literal) => {
        lane_entry!($entry, $tile, $features, $wide);

        #[inline]
        #[target_feature(enable = $features)]
        #[allow(clippy::needless_range_loop)] // `j` indexes the accumulators and the lanes alike
        fn $tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; 8]]) {
            let nb = x.cols / 256;
            let xq = LaneBlocks::new(&x.q, lane, L, x.cols);
            let xd = LaneBlocks::new(&x.d, lane, L, nb);
            let xp = LaneBlocks::new(&x.kpairs, lane, L, 4 * nb);
            let (mask, five) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
            let group_bytes = 8 * (Q4_K_ROW_BYTES + if $fifth { 32 } else { 0 });
            let mut acc = [_mm256_setzero_ps(); L];
            for (b, p) in blk.chunks_exact(group_bytes).enumerate().take(nb) {
                let mut sumi = [_mm256_setzero_si256(); L];
                for c in 0..4 {
                    for half in 0..2 {
                        // The whole block two ahead, an eighth per step (see the 16-row kernel).
                        prefetch_part_ahead(p, group_bytes, 2 * c + half, 8, false);
                        // Sub-block 2c (low nibbles) or 2c + 1 (high nibbles): elements
                        // 64c + 32·half + 4k .. +4 of the 8 rows in vector k.
                        let mut w = [_mm256_setzero_si256(); 8];
                        for k in 0..8 {
                            let v = load256(&p[160 + 32 * (8 * c + k)..]);
                            w[k] = if half == 0 {
                                _mm256_and_si256(v, mask)
                            } else {
                                _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask)
                            };
                            if $fifth {
                                // Bit 2c + half of each byte to bit 4 (16-bit shifts: what
                                // crosses into the neighbouring byte lands outside bit 4).
                                let qh = load256(&p[8 * Q5_K_HIGH_BITS + 32 * k..]);
                                let bit = (2 * c + half) as i32;
                                let h = if bit <= 4 {
                                    _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - bit))
                                } else {
                                    _mm256_srl_epi16(qh, _mm_cvtsi32_si128(bit - 4))
                                };
                                w[k] = _mm256_or_si256(w[k], _mm256_and_si256(h, five));
                            }
                        }
                        let sc = bytes_to_i32::<false>(&p[32 + 8 * (2 * c + half)..]);
                        let base = 256 * b + 64 * c + 32 * half;
                        for j in 0..L {
                            let group = |k: usize| _mm256_set1_epi32(xq.quad(j, base + 4 * k));
                            let mut s0 = $dot(_mm256_setzero_si256(), w[0], group(0));
                            let mut s1 = $dot(_mm256_setzero_si256(), w[1], group(1));
                            for k in (2..8).step_by(2) {
                                s0 = $dot(s0, w[k], group(k));
                                s1 = $dot(s1, w[k + 1], group(k + 1));
                            }
                            sumi[j] = _mm256_add_epi32(sumi[j], _mm256_mullo_epi32(_mm256_add_epi32(s0, s1), sc));
                        }
                    }
                }
                // Minimum pairs `(m[2p], m[2p+1])` per row as i16, against each lane's pair of
                // 32-value sums.
                let mins: [__m256i; 4] = std::array::from_fn(|q| {
                    // SAFETY: 16 bytes at 96 + 16q < 160 ≤ p.len(); an unaligned load.
                    _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(p[96 + 16 * q..112 + 16 * q].as_ptr().cast()) })
                });
                let d = f16x8(&p[0..16]);
                let dmin = f16x8(&p[16..32]);
                for j in 0..L {
                    let pair = |q: usize| _mm256_set1_epi32(xp.get(j, 4 * b + q));
                    let mut summins = _mm256_madd_epi16(mins[0], pair(0));
                    for q in 1..4 {
                        summins = _mm256_add_epi32(summins, _mm256_madd_epi16(mins[q], pair(q)));
                    }
                    let dx = _mm256_set1_ps(xd.get(j, b));
                    let t = _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(sumi[j]));
                    let m = _mm256_mul_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(summins));
                    acc[j] = _mm256_add_ps(acc[j], _mm256_sub_ps(t, m));
                }
            }
            for j in 0..L {
                // SAFETY: `out[j]` holds exactly 8 f32; unaligned store.
                unsafe { _mm256_storeu_ps(out[j].as_mut_ptr(), acc[j]) };
            }
        }
    };
}

macro_rules! define_q6_k_group {
    ($entry:ident, $tile:ident, $features:literal, $dot:ident, $wide:literal) => {
        lane_entry!($entry, $tile, $features, $wide);

        #[inline]
        #[target_feature(enable = $features)]
        #[allow(clippy::needless_range_loop)] // `j` indexes the accumulators and the lanes alike
        fn $tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; 8]]) {
            let nb = x.cols / 256;
            let xq = LaneBlocks::new(&x.q, lane, L, x.cols);
            let xd = LaneBlocks::new(&x.d, lane, L, nb);
            let xo = LaneBlocks::new(&x.sub_offsets, lane, L, 16 * nb);
            let (low, two) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
            let mut acc = [_mm256_setzero_ps(); L];
            for (b, p) in blk.chunks_exact(Q6_K_GROUP_BYTES).enumerate().take(nb) {
                let mut sumi = [_mm256_setzero_si256(); L];
                for h in 0..2 {
                    for kk in 0..2 {
                        // Stream `st`: elements 128h + 32st + 4k .. +4 (k = 4kk .. 4kk + 4), all
                        // of sub-block 8h + 2st + kk: the low (st < 2) or high nibbles of `ql`
                        // part st & 1, and bits 2st, 2st + 1 of `qh` as bits 4 and 5.
                        for st in 0..4 {
                            // The whole block two ahead, an eighth every other step (see the
                            // 16-row kernel; a sixteenth per step cost the AVX2 kernel 10 %).
                            if st % 2 == 0 {
                                prefetch_part_ahead(p, Q6_K_GROUP_BYTES, 4 * h + 2 * kk + st / 2, 8, false);
                            }
                            // Plain loops, not closures: a closure here was compiled on its
                            // own, without the target features, and called per vector (the
                            // kernel ran at a tenth of its speed).
                            let mut w = [_mm256_setzero_si256(); 4];
                            for i in 0..4 {
                                let k = 4 * kk + i;
                                let ql = load256(&p[144 + 32 * ((2 * h + (st & 1)) * 8 + k)..]);
                                let qh = load256(&p[1168 + 32 * (8 * h + k)..]);
                                let nib = if st < 2 {
                                    _mm256_and_si256(ql, low)
                                } else {
                                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql), low)
                                };
                                let high = match st {
                                    0 => _mm256_slli_epi16::<4>(qh),
                                    1 => _mm256_slli_epi16::<2>(qh),
                                    2 => qh,
                                    _ => _mm256_srli_epi16::<2>(qh),
                                };
                                w[i] = _mm256_or_si256(nib, _mm256_and_si256(high, two));
                            }
                            let s = 8 * h + 2 * st + kk;
                            let sc = bytes_to_i32::<true>(&p[16 + 8 * s..]);
                            let base = 256 * b + 128 * h + 32 * st + 16 * kk;
                            for j in 0..L {
                                let start = _mm256_set1_epi32(xo.get(j, 16 * b + s));
                                let s0 = $dot(start, w[0], _mm256_set1_epi32(xq.quad(j, base)));
                                let s1 = $dot(
                                    _mm256_setzero_si256(),
                                    w[1],
                                    _mm256_set1_epi32(xq.quad(j, base + 4)),
                                );
                                let s0 = $dot(s0, w[2], _mm256_set1_epi32(xq.quad(j, base + 8)));
                                let s1 = $dot(s1, w[3], _mm256_set1_epi32(xq.quad(j, base + 12)));
                                sumi[j] = _mm256_add_epi32(sumi[j], _mm256_mullo_epi32(_mm256_add_epi32(s0, s1), sc));
                            }
                        }
                    }
                }
                let d = f16x8(&p[0..16]);
                for j in 0..L {
                    let dx = _mm256_set1_ps(xd.get(j, b));
                    let t = _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(sumi[j]));
                    acc[j] = _mm256_add_ps(acc[j], t);
                }
            }
            for j in 0..L {
                // SAFETY: `out[j]` holds exactly 8 f32; unaligned store.
                unsafe { _mm256_storeu_ps(out[j].as_mut_ptr(), acc[j]) };
            }
        }
    };
}

define_q4_k_group!(q4_k_group, q4_k_tile, "avx2,fma,f16c", acc_dot, 2, false);
define_q4_k_group!(
    q4_k_group_vnni,
    q4_k_tile_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    acc_dot_vnni,
    4,
    false
);
define_q4_k_group!(q5_k_group, q5_k_tile, "avx2,fma,f16c", acc_dot, 2, true);
define_q4_k_group!(
    q5_k_group_vnni,
    q5_k_tile_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    acc_dot_vnni,
    4,
    true
);
define_q6_k_group!(q6_k_group, q6_k_tile, "avx2,fma,f16c", acc_dot, 2);
define_q6_k_group!(
    q6_k_group_vnni,
    q6_k_tile_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    acc_dot_vnni,
    4
);

/// 16 bytes at `b` widened to the 16 rows' i32 (unsigned, or signed when `SIGNED`).
#[inline]
#[target_feature(enable = "avx512f")]
fn bytes_to_i32x16<const SIGNED: bool>(b: &[u8]) -> __m512i {
    assert!(b.len() >= 16);
    // SAFETY: the assertion guarantees 16 readable bytes; an unaligned load.
    let v = unsafe { _mm_loadu_si128(b.as_ptr().cast()) };
    if SIGNED {
        _mm512_cvtepi8_epi32(v)
    } else {
        _mm512_cvtepu8_epi32(v)
    }
}

/// The entry of a 16-row kernel: tiles of 4 lanes, then 2, then 1, with the weight stream
/// prefetched as the other wide kernels do it (`weight_prefetch_nta`).
macro_rules! wide_lanes {
    ($entry:ident, $tile:ident) => {
        #[doc = "`out[l][r] = row r of the 16-row group · x[lane0 + l]` for `l < out.len() ≤ MAX_LANES`."]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(crate) fn $entry(blk: &[u8], x: &Activations, lane0: usize, out: &mut [[f32; WIDE_ROWS]]) {
            let n = out.len();
            let nta = weight_prefetch_nta();
            let mut l = 0;
            while l < n {
                let m = if n - l >= 4 { 4 } else { (n - l).min(2) };
                let tile = &mut out[l..l + m];
                match (m, nta) {
                    (4, true) => $tile::<4, true>(blk, x, lane0 + l, tile),
                    (4, false) => $tile::<4, false>(blk, x, lane0 + l, tile),
                    (2, true) => $tile::<2, true>(blk, x, lane0 + l, tile),
                    (2, false) => $tile::<2, false>(blk, x, lane0 + l, tile),
                    (_, true) => $tile::<1, true>(blk, x, lane0 + l, tile),
                    (_, false) => $tile::<1, false>(blk, x, lane0 + l, tile),
                }
                l += m;
            }
        }
    };
}

wide_lanes!(q4_k_group_wide, q4_k_tile_wide);
wide_lanes!(q5_k_group_wide, q5_k_tile_wide);
wide_lanes!(q6_k_group_wide, q6_k_tile_wide);

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q4_k_tile_wide<const L: usize, const NTA: bool>(
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [[f32; WIDE_ROWS]],
) {
    q45_k_tile_wide::<L, NTA, false>(blk, x, lane, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn q5_k_tile_wide<const L: usize, const NTA: bool>(
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [[f32; WIDE_ROWS]],
) {
    q45_k_tile_wide::<L, NTA, true>(blk, x, lane, out)
}

/// [`q4_k_group`] (Q5_K with `FIFTH`) on 16 rows: 2368 (2880) bytes per (group, super-block),
/// the 8-row layout with every 8 replaced by 16; the same integers and f32 operations per row,
/// so the same bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::needless_range_loop)] // `j` indexes the accumulators and the lanes alike
fn q45_k_tile_wide<const L: usize, const NTA: bool, const FIFTH: bool>(
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [[f32; WIDE_ROWS]],
) {
    let nb = x.cols / 256;
    let xq = LaneBlocks::new(&x.q, lane, L, x.cols);
    let xd = LaneBlocks::new(&x.d, lane, L, nb);
    let xp = LaneBlocks::new(&x.kpairs, lane, L, 4 * nb);
    let (mask, five) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x10));
    let group_bytes = 16 * (Q4_K_ROW_BYTES + if FIFTH { 32 } else { 0 });
    let mut acc = [_mm512_setzero_ps(); L];
    for (b, p) in blk.chunks_exact(group_bytes).enumerate().take(nb) {
        let mut sumi = [_mm512_setzero_si512(); L];
        for c in 0..4 {
            // The whole super-block two ahead, an eighth per half-chunk: a fixed 1 KB past the
            // nibbles left the header lines to the hardware prefetcher and the stream ran
            // latency-bound (25 GB/s on one thread where Q8_0 reads 41).
            for half in 0..2 {
                prefetch_part_ahead(p, group_bytes, 2 * c + half, 8, NTA);
                let mut w = [_mm512_setzero_si512(); 8];
                for k in 0..8 {
                    let v = load512(&p[320 + 64 * (8 * c + k)..]);
                    w[k] = if half == 0 {
                        _mm512_and_si512(v, mask)
                    } else {
                        _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask)
                    };
                    if FIFTH {
                        let qh = load512(&p[16 * Q5_K_HIGH_BITS + 64 * k..]);
                        let bit = (2 * c + half) as i32;
                        let h = if bit <= 4 {
                            _mm512_sll_epi16(qh, _mm_cvtsi32_si128(4 - bit))
                        } else {
                            _mm512_srl_epi16(qh, _mm_cvtsi32_si128(bit - 4))
                        };
                        w[k] = _mm512_or_si512(w[k], _mm512_and_si512(h, five));
                    }
                }
                let sc = bytes_to_i32x16::<false>(&p[64 + 16 * (2 * c + half)..]);
                let base = 256 * b + 64 * c + 32 * half;
                for j in 0..L {
                    let mut s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_set1_epi32(xq.quad(j, base)));
                    let mut s1 =
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], _mm512_set1_epi32(xq.quad(j, base + 4)));
                    for k in (2..8).step_by(2) {
                        s0 = _mm512_dpbusd_epi32(s0, w[k], _mm512_set1_epi32(xq.quad(j, base + 4 * k)));
                        s1 = _mm512_dpbusd_epi32(s1, w[k + 1], _mm512_set1_epi32(xq.quad(j, base + 4 * k + 4)));
                    }
                    sumi[j] = _mm512_add_epi32(sumi[j], _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), sc));
                }
            }
        }
        let mut mins = [_mm512_setzero_si512(); 4];
        for q in 0..4 {
            // SAFETY: 32 bytes at 192 + 32q < 320 ≤ p.len(); an unaligned load.
            mins[q] =
                _mm512_cvtepu8_epi16(unsafe { _mm256_loadu_si256(p[192 + 32 * q..224 + 32 * q].as_ptr().cast()) });
        }
        let d = f16x16(&p[0..32]);
        let dmin = f16x16(&p[32..64]);
        for j in 0..L {
            let mut summins = _mm512_madd_epi16(mins[0], _mm512_set1_epi32(xp.get(j, 4 * b)));
            for q in 1..4 {
                summins = _mm512_add_epi32(
                    summins,
                    _mm512_madd_epi16(mins[q], _mm512_set1_epi32(xp.get(j, 4 * b + q))),
                );
            }
            let dx = _mm512_set1_ps(xd.get(j, b));
            let t = _mm512_mul_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(sumi[j]));
            let m = _mm512_mul_ps(_mm512_mul_ps(dmin, dx), _mm512_cvtepi32_ps(summins));
            acc[j] = _mm512_add_ps(acc[j], _mm512_sub_ps(t, m));
        }
    }
    for j in 0..L {
        // SAFETY: `out[j]` holds exactly 16 f32; unaligned store.
        unsafe { _mm512_storeu_ps(out[j].as_mut_ptr(), acc[j]) };
    }
}

/// [`q6_k_group`] on 16 rows: 3360 bytes per (group, super-block), the 8-row layout with every
/// 8 replaced by 16; the same integers and f32 operations per row, so the same bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::needless_range_loop)] // `j` indexes the accumulators and the lanes alike
fn q6_k_tile_wide<const L: usize, const NTA: bool>(
    blk: &[u8],
    x: &Activations,
    lane: usize,
    out: &mut [[f32; WIDE_ROWS]],
) {
    let nb = x.cols / 256;
    let xq = LaneBlocks::new(&x.q, lane, L, x.cols);
    let xd = LaneBlocks::new(&x.d, lane, L, nb);
    let xo = LaneBlocks::new(&x.sub_offsets, lane, L, 16 * nb);
    let (low, two) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    let mut acc = [_mm512_setzero_ps(); L];
    for (b, p) in blk.chunks_exact(Q6_K_WIDE_BYTES).enumerate().take(nb) {
        let mut sumi = [_mm512_setzero_si512(); L];
        for h in 0..2 {
            for kk in 0..2 {
                for st in 0..4 {
                    // The whole super-block two ahead, a sixteenth per step: issued half a
                    // block at a time (26 lines at once) the stream ran at 30 GB/s per core.
                    prefetch_part_ahead(p, Q6_K_WIDE_BYTES, 8 * h + 4 * kk + st, 16, NTA);
                    let mut w = [_mm512_setzero_si512(); 4];
                    for i in 0..4 {
                        let k = 4 * kk + i;
                        let ql = load512(&p[288 + 64 * ((2 * h + (st & 1)) * 8 + k)..]);
                        let qh = load512(&p[2336 + 64 * (8 * h + k)..]);
                        let nib = if st < 2 {
                            _mm512_and_si512(ql, low)
                        } else {
                            _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low)
                        };
                        let high = match st {
                            0 => _mm512_slli_epi16::<4>(qh),
                            1 => _mm512_slli_epi16::<2>(qh),
                            2 => qh,
                            _ => _mm512_srli_epi16::<2>(qh),
                        };
                        w[i] = _mm512_or_si512(nib, _mm512_and_si512(high, two));
                    }
                    let s = 8 * h + 2 * st + kk;
                    let sc = bytes_to_i32x16::<true>(&p[32 + 16 * s..]);
                    let base = 256 * b + 128 * h + 32 * st + 16 * kk;
                    for j in 0..L {
                        let start = _mm512_set1_epi32(xo.get(j, 16 * b + s));
                        let s0 = _mm512_dpbusd_epi32(start, w[0], _mm512_set1_epi32(xq.quad(j, base)));
                        let s1 =
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], _mm512_set1_epi32(xq.quad(j, base + 4)));
                        let s0 = _mm512_dpbusd_epi32(s0, w[2], _mm512_set1_epi32(xq.quad(j, base + 8)));
                        let s1 = _mm512_dpbusd_epi32(s1, w[3], _mm512_set1_epi32(xq.quad(j, base + 12)));
                        sumi[j] = _mm512_add_epi32(sumi[j], _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), sc));
                    }
                }
            }
        }
        let d = f16x16(&p[0..32]);
        for j in 0..L {
            let dx = _mm512_set1_ps(xd.get(j, b));
            acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(sumi[j])));
        }
    }
    for j in 0..L {
        // SAFETY: `out[j]` holds exactly 16 f32; unaligned store.
        unsafe { _mm512_storeu_ps(out[j].as_mut_ptr(), acc[j]) };
    }
}
