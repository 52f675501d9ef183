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
    use crate::vector::tests::data;

    /// One shape's inputs for the A/B below.
    struct Case {
        d: usize,
        g: usize,
        m16: Vec<u16>,
        m32: Vec<f32>,
        q: Vec<f32>,
        p: Vec<f32>,
        sc: Vec<f32>,
        out: Vec<f32>,
    }

    const PS: usize = 260;

    fn cases() -> Vec<Case> {
        [(64usize, 1usize), (64, 3), (128, 1), (128, 2), (128, 4), (256, 2), (256, 4)]
            .into_iter()
            .map(|(d, g)| Case {
                d,
                g,
                m16: data(d * 260, 1).iter().map(|&x| crate::f32_to_f16(x)).collect(),
                m32: data(d * 260, 2),
                q: data(g * d, 3),
                p: data(g * PS, 4),
                sc: vec![0.0; g * PS],
                out: vec![0.0; g * d],
            })
            .collect()
    }

    /// Run one width's loops, old or new, over every case.
    fn run(cases: &mut [Case], wide: bool, new: bool) {
        let rows = 0..257usize;
        for c in cases.iter_mut() {
            let Case {
                d,
                m16,
                m32,
                q,
                p,
                sc,
                out,
                ..
            } = c;
            let d = *d;
            // SAFETY: the callers checked the features of the width they ask for.
            unsafe {
                match (wide, new) {
                    (false, true) => {
                        dot_group_avx2(q, d, m16, d, 0, rows.clone(), sc, PS);
                        dot_group_avx2(q, d, m32, d, 0, rows.clone(), sc, PS);
                        weighted_group_avx2(p, PS, m16, d, 0, rows.clone(), out, d);
                        weighted_group_avx2(p, PS, m32, d, 0, rows.clone(), out, d);
                    }
                    (false, false) => {
                        use crate::attention_rows::x86 as o;
                        o::dot_group(q, d, m16, d, 0, rows.clone(), sc, PS);
                        o::dot_group(q, d, m32, d, 0, rows.clone(), sc, PS);
                        o::weighted_group(p, PS, m16, d, 0, rows.clone(), out, d);
                        o::weighted_group(p, PS, m32, d, 0, rows.clone(), out, d);
                    }
                    (true, true) => {
                        dot_group_avx512(q, d, m16, d, 0, rows.clone(), sc, PS);
                        dot_group_avx512(q, d, m32, d, 0, rows.clone(), sc, PS);
                        weighted_group_avx512(p, PS, m16, d, 0, rows.clone(), out, d);
                        weighted_group_avx512(p, PS, m32, d, 0, rows.clone(), out, d);
                    }
                    (true, false) => {
                        use crate::attention_rows_x86_wide as w;
                        w::dot_group(q, d, m16, d, 0, rows.clone(), sc, PS);
                        w::dot_group(q, d, m32, d, 0, rows.clone(), sc, PS);
                        w::weighted_group(p, PS, m16, d, 0, rows.clone(), out, d);
                        w::weighted_group(p, PS, m32, d, 0, rows.clone(), out, d);
                    }
                }
            }
        }
    }

    /// Callgrind A/B of the 256-bit loops against the previous ones: `ANELM_AB=old|new|none`
    /// (none: only the set-up, to subtract). Run by hand: `valgrind --tool=callgrind <test
    /// binary> --ignored --exact attention_rows_x86::tests::ab_avx2`.
    #[test]
    #[ignore]
    fn ab_avx2() {
        let which = std::env::var("ANELM_AB").unwrap_or_default();
        if Avx2::detect().is_none() {
            return;
        }
        let mut cases = cases();
        for _ in 0..20 {
            match which.as_str() {
                "new" => run(&mut cases, false, true),
                "old" => run(&mut cases, false, false),
                _ => {}
            }
        }
        std::hint::black_box(&cases.iter().map(|c| c.sc[0] + c.out[0]).sum::<f32>());
    }

    /// Wall-clock A/B (valgrind has no AVX-512): old and new alternating, 101 rounds of each
    /// width, medians printed in µs per round. Run by hand with `--ignored --nocapture`.
    #[test]
    #[ignore]
    fn ab_timed() {
        let (Some(_), Some(_)) = (Avx2::detect(), Avx512::detect()) else { return };
        let mut cases = cases();
        for wide in [false, true] {
            let (mut old, mut new) = (Vec::new(), Vec::new());
            for round in 0..202 {
                let is_new = round % 2 == 1;
                let t = std::time::Instant::now();
                for _ in 0..5 {
                    run(&mut cases, wide, is_new);
                }
                let us = t.elapsed().as_secs_f64() * 1e6 / 5.0;
                if is_new { new.push(us) } else { old.push(us) }
            }
            for v in [&mut old, &mut new] {
                v.sort_by(f64::total_cmp);
            }
            let q = |v: &[f64]| (v[v.len() / 4], v[v.len() / 2], v[3 * v.len() / 4]);
            println!("wide={wide}: old {:?} new {:?} (quartiles, µs per round)", q(&old), q(&new));
        }
    }
}
