//! The 512-bit attention row loops of [`crate::attention_rows`] (AVX-512F/DQ), with exactly the
//! per-(head, row) arithmetic of the 256-bit ones, so results are bit-identical to
//! [`crate::dot_f32`] and [`crate::axpy_f32`] whatever the register width.
//!
//! Why: in a batched decode step attention is per-lane work (each session reads its own cache),
//! a sixth of a four-stream step, and compute-bound. The scores keep `dot_f32`'s eight-lane
//! partial sums, so one zmm register holds the partial sums of two rows (rows `j` and `j + 1` in
//! its halves): half the multiplies and adds per row. The weighted sum is element-wise, so it
//! simply runs on sixteen outputs per instruction.

use std::arch::x86_64::*;

// The same row prefetch and per-value widening as the 256-bit loops.
use crate::attention_rows::x86::{Load8, ROWS_AHEAD, prefetch_first_rows, prefetch_row};

/// Whether this CPU runs these loops (besides the AVX2/F16C the narrow ones need).
pub(crate) fn available() -> bool {
    let f = crate::Features::get();
    f.avx512f && f.avx512dq
}

/// Cached values in their storage type, loaded sixteen (or two rows of eight) at a time; one
/// value at a time (the tails) through the 256-bit loops' [`Load8::widen`].
pub(crate) trait Load16: Load8 {
    /// Values `at .. at + 16` of `m` as f32.
    ///
    /// # Safety
    /// AVX-512F must be available (bounds are checked).
    unsafe fn load16(m: &[Self], at: usize) -> __m512;
    /// Values `a .. a + 8` in the low half and `b .. b + 8` in the high half.
    ///
    /// # Safety
    /// AVX-512F/DQ must be available (bounds are checked).
    unsafe fn load8x2(m: &[Self], a: usize, b: usize) -> __m512;
}

impl Load16 for f32 {
    #[inline(always)]
    unsafe fn load16(m: &[f32], at: usize) -> __m512 {
        let c = &m[at..at + 16];
        // SAFETY: `c` holds exactly 16 f32; unaligned load; AVX-512F per the caller.
        unsafe { _mm512_loadu_ps(c.as_ptr()) }
    }
    #[inline(always)]
    unsafe fn load8x2(m: &[f32], a: usize, b: usize) -> __m512 {
        let (lo, hi) = (&m[a..a + 8], &m[b..b + 8]);
        // SAFETY: each slice holds exactly 8 f32; unaligned loads; AVX-512F/DQ per the caller.
        unsafe {
            _mm512_insertf32x8::<1>(
                _mm512_castps256_ps512(_mm256_loadu_ps(lo.as_ptr())),
                _mm256_loadu_ps(hi.as_ptr()),
            )
        }
    }
}

impl Load16 for u16 {
    #[inline(always)]
    unsafe fn load16(m: &[u16], at: usize) -> __m512 {
        let c = &m[at..at + 16];
        // SAFETY: `c` holds exactly 16 u16 (32 bytes); unaligned load; AVX-512F per the caller.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(c.as_ptr().cast())) }
    }
    #[inline(always)]
    unsafe fn load8x2(m: &[u16], a: usize, b: usize) -> __m512 {
        let (lo, hi) = (&m[a..a + 8], &m[b..b + 8]);
        // SAFETY: each slice holds exactly 8 u16 (16 bytes); unaligned loads; AVX-512F per the
        // caller (AVX2 for the insert is implied).
        unsafe {
            let both = _mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(_mm_loadu_si128(lo.as_ptr().cast())),
                _mm_loadu_si128(hi.as_ptr().cast()),
            );
            _mm512_cvtph_ps(both)
        }
    }
}

/// The two eight-lane partial sums in `acc` (row A low, row B high) reduced as `dot_f32`
/// reduces one: `h_i = a_i + a_(i+4)`, then `(h_0 + h_1) + (h_2 + h_3)` (the grouping is what
/// fixes the rounding; each addition is commutative).
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce_pair(acc: __m512) -> (f32, f32) {
    // Swap the 128-bit quarters within each half: lanes 0..4 then hold h for row A, 8..12 for B.
    let h = _mm512_add_ps(acc, _mm512_shuffle_f32x4::<0b10_11_00_01>(acc, acc));
    let u = _mm512_add_ps(h, _mm512_permute_ps::<0b10_11_00_01>(h));
    let v = _mm512_add_ps(u, _mm512_permute_ps::<0b01_00_11_10>(u));
    (_mm512_cvtss_f32(v), _mm_cvtss_f32(_mm512_extractf32x4_ps::<2>(v)))
}

/// Scores of `G` heads against `2·P` rows at a time: the rows of `rows` in pairs; returns how
/// many rows it scored (the even part; the caller does the last odd row).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_pairs<T: Load16, const G: usize, const P: usize>(
    q: &[f32],
    d: usize,
    m: &[T],
    stride: usize,
    offset: usize,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
    out_stride: usize,
) -> usize {
    assert!(q.len() >= G * d);
    let split = d - d % 8;
    let (mut j, mut i) = (rows.start, 0);
    while j + 2 * P <= rows.end {
        for r in 0..2 * P {
            prefetch_row(m, j + r + ROWS_AHEAD, stride, offset, d);
        }
        let mut acc = [[_mm512_setzero_ps(); G]; P];
        for c in (0..split).step_by(8) {
            let mut qv = [_mm512_setzero_ps(); G];
            for (h, v) in qv.iter_mut().enumerate() {
                let qc = &q[h * d + c..h * d + c + 8];
                // SAFETY: `qc` holds exactly 8 f32; unaligned load, copied to both halves.
                *v = _mm512_broadcast_f32x8(unsafe { _mm256_loadu_ps(qc.as_ptr()) });
            }
            for (p, a) in acc.iter_mut().enumerate() {
                let at = (j + 2 * p) * stride + offset + c;
                // SAFETY: `c + 8 ≤ d`, inside both rows (bounds-checked in `load8x2`).
                let pair = unsafe { T::load8x2(m, at, at + stride) };
                for (a, qv) in a.iter_mut().zip(&qv) {
                    *a = _mm512_fmadd_ps(*qv, pair, *a);
                }
            }
        }
        for (p, a) in acc.iter().enumerate() {
            for (h, a) in a.iter().enumerate() {
                let (mut s0, mut s1) = reduce_pair(*a);
                if split < d {
                    let qt = &q[h * d + split..(h + 1) * d];
                    for (r, s) in [(0, &mut s0), (1, &mut s1)] {
                        let at = (j + 2 * p + r) * stride + offset;
                        for (x, y) in qt.iter().zip(&m[at + split..at + d]) {
                            *s = x.mul_add(y.widen(), *s);
                        }
                    }
                }
                out[h * out_stride + i + 2 * p] = s0;
                out[h * out_stride + i + 2 * p + 1] = s1;
            }
        }
        (j, i) = (j + 2 * P, i + 2 * P);
    }
    if P > 1 && j + 2 <= rows.end {
        // SAFETY: same features; the remaining pairs one at a time.
        i += unsafe { dot_pairs::<T, G, 1>(q, d, m, stride, offset, j..rows.end, &mut out[i..], out_stride) };
    }
    i
}

/// Scores of `q.len() / d` (1 ..= 8) heads against the rows of `rows` in pairs; returns how many
/// rows (from `rows.start`) it scored: all but a last odd one.
///
/// # Safety
/// AVX2, F16C, AVX-512F and AVX-512DQ must be available ([`available`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn dot_group<T: Load16>(
    q: &[f32],
    d: usize,
    m: &[T],
    stride: usize,
    offset: usize,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
    out_stride: usize,
) -> usize {
    prefetch_first_rows(m, &rows, stride, offset, d);
    // Pairs per block chosen so G·P accumulators, G query chunks and P row pairs fit the 32
    // registers.
    // SAFETY (every arm): same features as this function.
    unsafe {
        match q.len() / d {
            1 => dot_pairs::<T, 1, 8>(q, d, m, stride, offset, rows, out, out_stride),
            2 => dot_pairs::<T, 2, 4>(q, d, m, stride, offset, rows, out, out_stride),
            3 => dot_pairs::<T, 3, 4>(q, d, m, stride, offset, rows, out, out_stride),
            4 => dot_pairs::<T, 4, 4>(q, d, m, stride, offset, rows, out, out_stride),
            5 => dot_pairs::<T, 5, 2>(q, d, m, stride, offset, rows, out, out_stride),
            6 => dot_pairs::<T, 6, 2>(q, d, m, stride, offset, rows, out, out_stride),
            7 => dot_pairs::<T, 7, 2>(q, d, m, stride, offset, rows, out, out_stride),
            8 => dot_pairs::<T, 8, 2>(q, d, m, stride, offset, rows, out, out_stride),
            g => unreachable!("{g} heads in one group (at most 8)"),
        }
    }
}

/// `out_h += Σ_i p[h·p_stride + i] · row_(rows.start + i)` for `G` heads, sixteen outputs of each
/// in `C` registers across the rows (`o + p·row` per element, in row order, as `axpy_f32`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
unsafe fn weighted_block<T: Load16, const G: usize, const C: usize>(
    p: &[f32],
    p_stride: usize,
    m: &[T],
    stride: usize,
    offset: usize,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
    d: usize,
    chunks: std::ops::Range<usize>,
) {
    assert!(out.len() >= G * d && d.is_multiple_of(16) && chunks.end <= d / 16);
    let n = rows.len();
    for h in 0..G {
        assert!(h * p_stride + n <= p.len());
    }
    let mut c0 = chunks.start;
    while c0 + C <= chunks.end {
        let mut acc = [[_mm512_setzero_ps(); C]; G];
        for (h, a) in acc.iter_mut().enumerate() {
            for (cc, a) in a.iter_mut().enumerate() {
                let oc = &out[h * d + 16 * (c0 + cc)..h * d + 16 * (c0 + cc) + 16];
                // SAFETY: `oc` holds exactly 16 f32; unaligned load.
                *a = unsafe { _mm512_loadu_ps(oc.as_ptr()) };
            }
        }
        for (i, j) in rows.clone().enumerate() {
            let at = j * stride + offset;
            if c0 == chunks.start {
                prefetch_row(m, j + ROWS_AHEAD, stride, offset, d);
            }
            let mut w = [_mm512_setzero_ps(); G];
            for (h, w) in w.iter_mut().enumerate() {
                *w = _mm512_set1_ps(p[h * p_stride + i]);
            }
            for cc in 0..C {
                // SAFETY: `16·(c0 + cc) + 16 ≤ d`, inside the row (bounds-checked in `load16`).
                let r = unsafe { T::load16(m, at + 16 * (c0 + cc)) };
                for (a, w) in acc.iter_mut().zip(&w) {
                    a[cc] = _mm512_fmadd_ps(*w, r, a[cc]);
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            for (cc, a) in a.iter().enumerate() {
                let oc = &mut out[h * d + 16 * (c0 + cc)..h * d + 16 * (c0 + cc) + 16];
                // SAFETY: `oc` holds exactly 16 f32; unaligned store.
                unsafe { _mm512_storeu_ps(oc.as_mut_ptr(), *a) };
            }
        }
        c0 += C;
    }
    if C > 1 && c0 < chunks.end {
        // SAFETY: same features; the remaining chunks one at a time.
        unsafe { weighted_block::<T, G, 1>(p, p_stride, m, stride, offset, rows, out, d, c0..chunks.end) };
    }
}

/// [`weighted_block`] for `out.len() / d` (1 ..= 8) heads; `d` must be a multiple of 16.
///
/// # Safety
/// AVX2, F16C, AVX-512F and AVX-512DQ must be available ([`available`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn weighted_group<T: Load16>(
    p: &[f32],
    p_stride: usize,
    m: &[T],
    stride: usize,
    offset: usize,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
    d: usize,
) {
    prefetch_first_rows(m, &rows, stride, offset, d);
    let all = 0..d / 16;
    // SAFETY (every arm): same features as this function.
    unsafe {
        match out.len() / d {
            1 => weighted_block::<T, 1, 8>(p, p_stride, m, stride, offset, rows, out, d, all),
            2 => weighted_block::<T, 2, 8>(p, p_stride, m, stride, offset, rows, out, d, all),
            3 => weighted_block::<T, 3, 4>(p, p_stride, m, stride, offset, rows, out, d, all),
            4 => weighted_block::<T, 4, 4>(p, p_stride, m, stride, offset, rows, out, d, all),
            5 => weighted_block::<T, 5, 4>(p, p_stride, m, stride, offset, rows, out, d, all),
            6 => weighted_block::<T, 6, 4>(p, p_stride, m, stride, offset, rows, out, d, all),
            7 => weighted_block::<T, 7, 2>(p, p_stride, m, stride, offset, rows, out, d, all),
            8 => weighted_block::<T, 8, 2>(p, p_stride, m, stride, offset, rows, out, d, all),
            g => unreachable!("{g} heads in one group (at most 8)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fp16::{f16_to_f32, f32_to_f16};
    use crate::vector::tests::data;
    use crate::vector::{axpy_f32, dot_f32};

    /// The 512-bit loops called directly (the dispatcher may pick them or not), against the
    /// per-head reference, for every group size, pair count and an odd row left over.
    #[test]
    fn wide_loops_equal_per_head_dots_and_axpys_bit_for_bit() {
        if !available() || !crate::Features::get().avx2_fma_f16c() {
            eprintln!("no AVX-512F/DQ here: the 512-bit loops are not used on this CPU");
            return;
        }
        for d in [16usize, 24, 64, 128, 7] {
            for g in 1usize..=8 {
                let stride = d + 3;
                let m32 = data(stride * 48, 8);
                let m16: Vec<u16> = m32.iter().map(|&x| f32_to_f16(x * 2.0)).collect();
                let m16w: Vec<f32> = m16.iter().map(|&b| f16_to_f32(b)).collect();
                let q = data(g * d, 9);
                for rows in [1..40usize, 5..6, 0..19] {
                    let ps = 48;
                    let p = data(g * ps, 10);
                    let n = rows.len();
                    let mut got32 = vec![0.0; g * ps];
                    let mut got16 = vec![0.0; g * ps];
                    // SAFETY: features checked above.
                    let (done32, done16) = unsafe {
                        (
                            dot_group(&q, d, &m32, stride, 2, rows.clone(), &mut got32, ps),
                            dot_group(&q, d, &m16, stride, 2, rows.clone(), &mut got16, ps),
                        )
                    };
                    assert_eq!(done32, n - n % 2, "scores all pairs");
                    assert_eq!(done16, done32);
                    for (got, wide) in [(&got32, &m32), (&got16, &m16w)] {
                        for h in 0..g {
                            for (i, j) in rows.clone().take(done32).enumerate() {
                                let row = &wide[j * stride + 2..j * stride + 2 + d];
                                let want = dot_f32(&q[h * d..(h + 1) * d], row);
                                assert_eq!(got[h * ps + i].to_bits(), want.to_bits(), "dot d={d} g={g} h={h} j={j}");
                            }
                            assert!(got[h * ps + done32..(h + 1) * ps].iter().all(|&x| x == 0.0));
                        }
                    }
                    if d % 16 != 0 {
                        continue;
                    }
                    for (which, wide) in [(0, &m32), (1, &m16w)] {
                        let mut out = data(g * d, 11);
                        let mut want = out.clone();
                        // SAFETY: features checked above.
                        unsafe {
                            if which == 0 {
                                weighted_group(&p, ps, &m32, stride, 2, rows.clone(), &mut out, d);
                            } else {
                                weighted_group(&p, ps, &m16, stride, 2, rows.clone(), &mut out, d);
                            }
                        }
                        for h in 0..g {
                            for (i, j) in rows.clone().enumerate() {
                                let row = &wide[j * stride + 2..j * stride + 2 + d];
                                axpy_f32(p[h * ps + i], row, &mut want[h * d..(h + 1) * d]);
                            }
                        }
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&out), bits(&want), "weighted d={d} g={g} storage {which}");
                    }
                }
            }
        }
    }
}
