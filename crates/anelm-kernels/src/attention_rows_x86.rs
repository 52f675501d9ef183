//! The x86 attention row loops of [`crate::attention_rows`], written once over the vector width
//! ([`Lanes`]) and compiled for 256-bit ([`Avx2`]) and 512-bit ([`Avx512`]) registers, with
//! exactly the per-(head, row) arithmetic of [`crate::dot_f32`] and [`crate::axpy_f32`], so
//! results are bit-identical whatever the width.
//!
//! The scores keep `dot_f32`'s eight-lane partial sums: a 256-bit register holds one row's, a
//! 512-bit one the partial sums of two rows (rows `j` and `j + 1` in its halves: half the
//! multiplies and adds per row in a batched step, where attention is per-lane, compute-bound
//! work). The weighted sum is element-wise, so it runs on 8 or 16 outputs per instruction.

use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
use std::ops::Range;

use crate::lanes_x86::{Avx2, Avx512, CacheValue, Lanes};

/// Rows ahead of the one being read that the row loops prefetch.
const ROWS_AHEAD: usize = 24;

/// Hint the cache to fetch row `j` (its `d` values at `j·stride + offset`). The cached rows of
/// a session are cold at every layer (the weight stream passed through the caches since they
/// were last read) and a plane spans only a few pages, each of which the hardware prefetcher has
/// to learn anew; without the hint the loops wait on every few rows.
#[inline(always)]
fn prefetch_row<T>(m: &[T], j: usize, stride: usize, offset: usize, d: usize) {
    let base = m.as_ptr().cast::<u8>();
    let at = (j * stride + offset) * std::mem::size_of::<T>();
    for line in (0..d * std::mem::size_of::<T>()).step_by(64) {
        // SAFETY: `_mm_prefetch` is baseline SSE and only a hint: it never faults and reads
        // nothing architecturally, so the address (possibly past the rows) needs no bounds.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(at + line).cast()) };
    }
}

/// Hint the first `ROWS_AHEAD` rows of `rows`, which the row loops' own hints (always
/// `ROWS_AHEAD` rows on) do not cover; called once per block by the entry points.
#[inline(always)]
fn prefetch_first_rows<T>(m: &[T], rows: &Range<usize>, stride: usize, offset: usize, d: usize) {
    for j in rows.start..(rows.start + ROWS_AHEAD).min(rows.end) {
        prefetch_row(m, j, stride, offset, d);
    }
}

/// Scores of `G` heads against `U · L::ROWS8` rows at a time, per head the sequence of
/// `vector::dot`: eight-lane partial sums over the chunks in order, the same horizontal
/// reduction, then the tail in order; `U × G` independent accumulation chains hide the add
/// latency. Returns how many rows (from `rows.start`) it scored: whole blocks only.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dot_blocks<L: Lanes, T: CacheValue, const G: usize, const U: usize>(
    l: L,
    q: &[f32],
    d: usize,
    m: &[T],
    stride: usize,
    offset: usize,
    rows: Range<usize>,
    out: &mut [f32],
    out_stride: usize,
) -> usize {
    assert!(q.len() >= G * d);
    let split = d - d % 8;
    let per = U * L::ROWS8;
    let (mut j, mut i) = (rows.start, 0);
    while j + per <= rows.end {
        for r in 0..per {
            prefetch_row(m, j + r + ROWS_AHEAD, stride, offset, d);
        }
        let mut acc = [[l.zero(); G]; U];
        for c in (0..split).step_by(8) {
            let mut qv = [l.zero(); G];
            for (h, v) in qv.iter_mut().enumerate() {
                *v = l.load8_each(&q[h * d + c..h * d + c + 8]);
            }
            for (u, a) in acc.iter_mut().enumerate() {
                let row = l.load8_rows(m, (j + u * L::ROWS8) * stride + offset + c, stride);
                for (a, qv) in a.iter_mut().zip(&qv) {
                    *a = l.fmadd(*qv, row, *a);
                }
            }
        }
        for (u, a) in acc.iter().enumerate() {
            for (h, a) in a.iter().enumerate() {
                for (r, &s) in l.reduce8(*a).as_ref().iter().enumerate() {
                    let k = u * L::ROWS8 + r;
                    let mut s = s;
                    if split < d {
                        let at = (j + k) * stride + offset;
                        for (x, y) in q[h * d + split..(h + 1) * d].iter().zip(&m[at + split..at + d]) {
                            s = x.mul_add(y.widen(), s);
                        }
                    }
                    out[h * out_stride + i + k] = s;
                }
            }
        }
        (j, i) = (j + per, i + per);
    }
    i
}

/// [`dot_blocks`] with `U` register rows per block, then one at a time for the rest; returns how
/// many rows it scored (all but fewer than `L::ROWS8` at the end).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn dot_all<L: Lanes, T: CacheValue, const G: usize, const U: usize>(
    l: L,
    q: &[f32],
    d: usize,
    m: &[T],
    stride: usize,
    offset: usize,
    rows: Range<usize>,
    out: &mut [f32],
    out_stride: usize,
) -> usize {
    let done = dot_blocks::<L, T, G, U>(l, q, d, m, stride, offset, rows.clone(), out, out_stride);
    if U == 1 || rows.start + done + L::ROWS8 > rows.end {
        return done;
    }
    let rest = rows.start + done..rows.end;
    done + dot_blocks::<L, T, G, 1>(l, q, d, m, stride, offset, rest, &mut out[done..], out_stride)
}

/// `out_h += Σ_i p[h·p_stride + i] · row_(rows.start + i)` for `G` heads: per output element the
/// sequence of repeated `axpy` (`o + p·row` for each row in order), `C` registers of outputs of
/// each head held across the rows, over the register chunks `chunks` of the head width. Returns
/// the first chunk it did not do (fewer than `C` remain).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn weighted_chunks<L: Lanes, T: CacheValue, const G: usize, const C: usize>(
    l: L,
    p: &[f32],
    p_stride: usize,
    m: &[T],
    stride: usize,
    offset: usize,
    rows: Range<usize>,
    out: &mut [f32],
    d: usize,
    chunks: Range<usize>,
) -> usize {
    let w = L::F32S;
    assert!(out.len() >= G * d && d.is_multiple_of(w) && chunks.end <= d / w);
    let n = rows.len();
    for h in 0..G {
        assert!(h * p_stride + n <= p.len());
    }
    let mut c0 = chunks.start;
    while c0 + C <= chunks.end {
        let mut acc = [[l.zero(); C]; G];
        for (h, a) in acc.iter_mut().enumerate() {
            for (cc, a) in a.iter_mut().enumerate() {
                let at = h * d + w * (c0 + cc);
                *a = l.load(&out[at..at + w]);
            }
        }
        for (i, j) in rows.clone().enumerate() {
            let at = j * stride + offset;
            if c0 == chunks.start {
                prefetch_row(m, j + ROWS_AHEAD, stride, offset, d);
            }
            let mut wv = [l.zero(); G];
            for (h, wv) in wv.iter_mut().enumerate() {
                *wv = l.splat(p[h * p_stride + i]);
            }
            for cc in 0..C {
                let r = l.load_cache(m, at + w * (c0 + cc));
                for (a, wv) in acc.iter_mut().zip(&wv) {
                    a[cc] = l.fmadd(*wv, r, a[cc]);
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            for (cc, a) in a.iter().enumerate() {
                let at = h * d + w * (c0 + cc);
                l.store(&mut out[at..at + w], *a);
            }
        }
        c0 += C;
    }
    c0
}

/// [`weighted_chunks`] over the whole head width: `C` registers at a time, then one at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn weighted_all<L: Lanes, T: CacheValue, const G: usize, const C: usize>(
    l: L,
    p: &[f32],
    p_stride: usize,
    m: &[T],
    stride: usize,
    offset: usize,
    rows: Range<usize>,
    out: &mut [f32],
    d: usize,
) {
    let all = 0..d / L::F32S;
    let c0 = weighted_chunks::<L, T, G, C>(l, p, p_stride, m, stride, offset, rows.clone(), out, d, all.clone());
    if C > 1 && c0 < all.end {
        weighted_chunks::<L, T, G, 1>(l, p, p_stride, m, stride, offset, rows, out, d, c0..all.end);
    }
}

/// Scores of `q.len() / d` (1 ..= 8) heads against the rows of `rows` (see
/// `attention_rows::dot_rows_group`) in 256-bit registers, rows per block picked so the
/// accumulators fit the sixteen registers. Scores every row.
///
/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn dot_group_avx2<T: CacheValue>(
    q: &[f32],
    d: usize,
    m: &[T],
    stride: usize,
    offset: usize,
    rows: Range<usize>,
    out: &mut [f32],
    out_stride: usize,
) {
    // SAFETY: this function's contract.
    let l = unsafe { Avx2::assume() };
    prefetch_first_rows(m, &rows, stride, offset, d);
    match q.len() / d {
        1 => dot_all::<_, T, 1, 8>(l, q, d, m, stride, offset, rows, out, out_stride),
        2 => dot_all::<_, T, 2, 4>(l, q, d, m, stride, offset, rows, out, out_stride),
        3 => dot_all::<_, T, 3, 4>(l, q, d, m, stride, offset, rows, out, out_stride),
        4 => dot_all::<_, T, 4, 3>(l, q, d, m, stride, offset, rows, out, out_stride),
        5 => dot_all::<_, T, 5, 2>(l, q, d, m, stride, offset, rows, out, out_stride),
        6 => dot_all::<_, T, 6, 2>(l, q, d, m, stride, offset, rows, out, out_stride),
        7 => dot_all::<_, T, 7, 1>(l, q, d, m, stride, offset, rows, out, out_stride),
        8 => dot_all::<_, T, 8, 1>(l, q, d, m, stride, offset, rows, out, out_stride),
        g => unreachable!("{g} heads in one group (at most 8)"),
    };
}

/// [`dot_group_avx2`] in 512-bit registers, rows in pairs, pairs per block picked so the
/// accumulators, query chunks and row pairs fit the 32 registers; returns how many rows (from
/// `rows.start`) it scored: all but a last odd one.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512F and AVX-512DQ must be available.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn dot_group_avx512<T: CacheValue>(
    q: &[f32],
    d: usize,
    m: &[T],
    stride: usize,
    offset: usize,
    rows: Range<usize>,
    out: &mut [f32],
    out_stride: usize,
) -> usize {
    // SAFETY: this function's contract.
    let l = unsafe { Avx512::assume() };
    prefetch_first_rows(m, &rows, stride, offset, d);
    match q.len() / d {
        1 => dot_all::<_, T, 1, 8>(l, q, d, m, stride, offset, rows, out, out_stride),
        2 => dot_all::<_, T, 2, 4>(l, q, d, m, stride, offset, rows, out, out_stride),
        3 => dot_all::<_, T, 3, 4>(l, q, d, m, stride, offset, rows, out, out_stride),
        4 => dot_all::<_, T, 4, 4>(l, q, d, m, stride, offset, rows, out, out_stride),
        5 => dot_all::<_, T, 5, 2>(l, q, d, m, stride, offset, rows, out, out_stride),
        6 => dot_all::<_, T, 6, 2>(l, q, d, m, stride, offset, rows, out, out_stride),
        7 => dot_all::<_, T, 7, 2>(l, q, d, m, stride, offset, rows, out, out_stride),
        8 => dot_all::<_, T, 8, 2>(l, q, d, m, stride, offset, rows, out, out_stride),
        g => unreachable!("{g} heads in one group (at most 8)"),
    }
}

/// The weighted sum of `out.len() / d` (1 ..= 8) heads (see
/// `attention_rows::weighted_rows_group`) in 256-bit registers; `d` must be a multiple of 8.
///
/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn weighted_group_avx2<T: CacheValue>(
    p: &[f32],
    p_stride: usize,
    m: &[T],
    stride: usize,
    offset: usize,
    rows: Range<usize>,
    out: &mut [f32],
    d: usize,
) {
    // SAFETY: this function's contract.
    let l = unsafe { Avx2::assume() };
    prefetch_first_rows(m, &rows, stride, offset, d);
    let g = out.len() / d;
    match g {
        1 => weighted_all::<_, T, 1, 8>(l, p, p_stride, m, stride, offset, rows, out, d),
        2 => weighted_all::<_, T, 2, 4>(l, p, p_stride, m, stride, offset, rows, out, d),
        3 => weighted_all::<_, T, 3, 4>(l, p, p_stride, m, stride, offset, rows, out, d),
        4 => weighted_all::<_, T, 4, 2>(l, p, p_stride, m, stride, offset, rows, out, d),
        5 => weighted_all::<_, T, 5, 2>(l, p, p_stride, m, stride, offset, rows, out, d),
        6 => weighted_all::<_, T, 6, 2>(l, p, p_stride, m, stride, offset, rows, out, d),
        7 => weighted_all::<_, T, 7, 1>(l, p, p_stride, m, stride, offset, rows, out, d),
        8 => weighted_all::<_, T, 8, 1>(l, p, p_stride, m, stride, offset, rows, out, d),
        g => unreachable!("{g} heads in one group (at most 8)"),
    }
}

/// [`weighted_group_avx2`] in 512-bit registers; `d` must be a multiple of 16.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512F and AVX-512DQ must be available.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn weighted_group_avx512<T: CacheValue>(
    p: &[f32],
    p_stride: usize,
    m: &[T],
    stride: usize,
    offset: usize,
    rows: Range<usize>,
    out: &mut [f32],
    d: usize,
) {
    // SAFETY: this function's contract.
    let l = unsafe { Avx512::assume() };
    prefetch_first_rows(m, &rows, stride, offset, d);
    let g = out.len() / d;
    match g {
        1 => weighted_all::<_, T, 1, 8>(l, p, p_stride, m, stride, offset, rows, out, d),
        2 => weighted_all::<_, T, 2, 8>(l, p, p_stride, m, stride, offset, rows, out, d),
        3 => weighted_all::<_, T, 3, 4>(l, p, p_stride, m, stride, offset, rows, out, d),
        4 => weighted_all::<_, T, 4, 4>(l, p, p_stride, m, stride, offset, rows, out, d),
        5 => weighted_all::<_, T, 5, 4>(l, p, p_stride, m, stride, offset, rows, out, d),
        6 => weighted_all::<_, T, 6, 4>(l, p, p_stride, m, stride, offset, rows, out, d),
        7 => weighted_all::<_, T, 7, 2>(l, p, p_stride, m, stride, offset, rows, out, d),
        8 => weighted_all::<_, T, 8, 2>(l, p, p_stride, m, stride, offset, rows, out, d),
        g => unreachable!("{g} heads in one group (at most 8)"),
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
        if Avx512::detect().is_none() {
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
                            dot_group_avx512(&q, d, &m32, stride, 2, rows.clone(), &mut got32, ps),
                            dot_group_avx512(&q, d, &m16, stride, 2, rows.clone(), &mut got16, ps),
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
                                weighted_group_avx512(&p, ps, &m32, stride, 2, rows.clone(), &mut out, d);
                            } else {
                                weighted_group_avx512(&p, ps, &m16, stride, 2, rows.clone(), &mut out, d);
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
