//! The x86-64 kernels of [`crate::packed`]: one group of 8 interleaved rows against up to
//! `MAX_LANES` activation lanes, AVX2 (`maddubs` + `madd`) and AVX-512 VNNI (`vpdpbusd`): Q8_0
//! here (Q4_1 in `packed_x86_q4_1.rs`), and the helpers the other 8-row kernels share.

use std::arch::x86_64::*;

use crate::activations::Activations;
use crate::simd_x86::load256;

/// Lanes one call handles (the caller loops over more).
pub(crate) const MAX_LANES: usize = 16;

/// 8 f16 values as f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(crate) fn f16x8(b: &[u8]) -> __m256 {
    assert!(b.len() >= 16);
    // SAFETY: the assertion guarantees 16 readable bytes; loadu has no alignment requirement.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(b.as_ptr().cast()) })
}

/// `lanes` consecutive lanes of `len` values each, starting at lane `first` of `data`: the
/// range is checked once, when made, so the hot loop indexes it without a bounds check per
/// (lane, block).
#[derive(Clone, Copy)]
pub(crate) struct LaneBlocks<T> {
    ptr: *const T,
    lanes: usize,
    len: usize,
}

impl<T: Copy> LaneBlocks<T> {
    #[inline(always)]
    pub(crate) fn new(data: &[T], first: usize, lanes: usize, len: usize) -> Self {
        let range = &data[first * len..(first + lanes) * len];
        Self {
            ptr: range.as_ptr(),
            lanes,
            len,
        }
    }

    /// Value `i` of lane `j`.
    #[inline(always)]
    pub(crate) fn get(&self, j: usize, i: usize) -> T {
        debug_assert!(j < self.lanes && i < self.len);
        // SAFETY: callers pass `j < lanes` (the tile's lane loop) and `i < len` (a block index
        // below `nb`, or an element of one), so `j · len + i` lies inside the checked range.
        unsafe { *self.ptr.add(j * self.len + i) }
    }
}

impl LaneBlocks<i8> {
    /// Quants `i .. i + 4` of lane `j` as one little-endian i32 (a `vpdpbusd` broadcast group).
    #[inline(always)]
    pub(crate) fn quad(&self, j: usize, i: usize) -> i32 {
        debug_assert!(j < self.lanes && i + 4 <= self.len);
        // SAFETY: as in `get`, with `i + 4 ≤ len` (a 4-quant group inside a 32-quant block);
        // an unaligned read of plain bytes.
        unsafe { std::ptr::read_unaligned(self.ptr.add(j * self.len + i).cast::<i32>()) }
    }
}

/// `acc + Σ` of the u8 × i8 products of `w` and `x` in groups of four (exact: weights are
/// nibbles or |int8| ≤ 127, activations within ±127, so no 16-bit pair sum can saturate).
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn acc_dot(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)))
}

/// `acc_dot` as one `vpdpbusd`.
#[inline]
#[target_feature(enable = "avx2,avx512vnni,avx512vl")]
pub(crate) fn acc_dot_vnni(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, w, x)
}

macro_rules! define_q8_group {
    ($entry:ident, $tile:ident, $features:literal, $dot:ident, $wide:literal) => {
        lane_entry!($entry, $tile, $features, $wide);

        #[inline]
        #[target_feature(enable = $features)]
        fn $tile<const L: usize>(blk: &[u8], x: &Activations, lane: usize, out: &mut [[f32; 8]]) {
            let nb = x.cols / 32;
            let xq = LaneBlocks::new(&x.q, lane, L, 32 * nb);
            let xd = LaneBlocks::new(&x.d, lane, L, nb);
            let mut acc = [_mm256_setzero_ps(); L];
            for (b, p) in blk.chunks_exact(272).enumerate().take(nb) {
                // A prefetch never faults, so the address may lie past the group's end.
                for ahead in [0, 64, 128, 192, 256] {
                    _mm_prefetch::<_MM_HINT_T0>(p.as_ptr().wrapping_add(PREFETCH + ahead).cast());
                }
                let d = f16x8(&p[0..16]);
                let w: [__m256i; 8] = std::array::from_fn(|k| load256(&p[16 + 32 * k..48 + 32 * k]));
                let mag: [__m256i; 8] = std::array::from_fn(|k| _mm256_sign_epi8(w[k], w[k]));
                for j in 0..L {
                    let group = |g: usize| _mm256_sign_epi8(_mm256_set1_epi32(xq.quad(j, 32 * b + 4 * g)), w[g]);
                    let mut s0 = $dot(_mm256_setzero_si256(), mag[0], group(0));
                    let mut s1 = $dot(_mm256_setzero_si256(), mag[1], group(1));
                    for g in (2..8).step_by(2) {
                        s0 = $dot(s0, mag[g], group(g));
                        s1 = $dot(s1, mag[g + 1], group(g + 1));
                    }
                    let isum = _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1));
                    acc[j] = _mm256_fmadd_ps(isum, _mm256_mul_ps(d, _mm256_set1_ps(xd.get(j, b))), acc[j]);
                }
            }
            for j in 0..L {
                // SAFETY: `out[j]` holds exactly 8 f32; unaligned store.
                unsafe { _mm256_storeu_ps(out[j].as_mut_ptr(), acc[j]) };
            }
        }
    };
}

/// The entry point of a group kernel: `out[l][r] = row r of the group · x[lane0 + l]` for
/// `l < out.len() ≤ MAX_LANES`, `$wide` lanes per tile pass, then a 2-lane tile and single
/// lanes.
macro_rules! lane_entry {
    ($entry:ident, $tile:ident, $features:literal, $wide:literal) => {
        #[doc = "`out[l][r] = row r of the group · x[lane0 + l]` for `l < out.len() ≤ MAX_LANES`."]
        #[target_feature(enable = $features)]
        #[allow(clippy::int_plus_one)] // `$wide` may be 1 (the ggml-order kernels on AVX2)
        pub(crate) fn $entry(blk: &[u8], x: &Activations, lane0: usize, out: &mut [[f32; 8]]) {
            let n = out.len();
            let mut l = 0;
            while l + $wide <= n {
                $tile::<$wide>(blk, x, lane0 + l, &mut out[l..l + $wide]);
                l += $wide;
            }
            // A remainder of 2 or more as a 2-lane tile (each weight block decoded once for
            // both), then single lanes.
            if $wide > 2 && n - l >= 2 {
                $tile::<2>(blk, x, lane0 + l, &mut out[l..l + 2]);
                l += 2;
            }
            while l < n {
                $tile::<1>(blk, x, lane0 + l, &mut out[l..l + 1]);
                l += 1;
            }
        }
    };
}

pub(crate) use lane_entry;

/// Bytes ahead of the current block that the group stream prefetches.
pub(crate) const PREFETCH: usize = 1024;

define_q8_group!(q8_0_group, q8_0_tile, "avx2,fma,f16c", acc_dot, 2);
define_q8_group!(
    q8_0_group_vnni,
    q8_0_tile_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    acc_dot_vnni,
    4
);
// Q4_1's 8-row entry points, with its 16-row tiles written once in `packed_x86_q4_1.rs`.
pub(crate) use crate::packed_x86_q4_1::{q4_1_group, q4_1_group_vnni};
