//! Attention over a KV cache for a group of query heads that share one KV head (grouped-query
//! attention): the q·k scores of every head against each cached row, and the probability-
//! weighted sum of the value rows. Each row is loaded (and, for an f16 cache, widened) once for
//! the whole group instead of once per head. Per head the arithmetic is exactly [`dot_f32`] and
//! repeated [`axpy_f32`] on the rows widened to f32, so results equal the per-head path bit for
//! bit (tested), whatever the group size or storage type.

use std::ops::Range;

use crate::fp16::f16_to_f32;
use crate::vector::{axpy_f32, dot_f32};

/// Cached rows in their storage type.
#[derive(Clone, Copy, Debug)]
pub enum CacheRows<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// f16 bits.
    F16(&'a [u16]),
}

/// Query heads handled in one pass over the rows (more are split into passes).
const MAX_GROUP: usize = 8;

/// Scores: for `g = q.len() / d` query heads (`q` = g × d, head after head) and each row `j` in
/// `rows`, `out[h·out_stride + (j − rows.start)] = q_h · row_j`, where `row_j` is the `d` values
/// at `m[j·stride + offset ..]`. Equal bit for bit to [`dot_f32`] per head and row.
#[allow(clippy::too_many_arguments)]
pub fn dot_rows_group(
    q: &[f32],
    d: usize,
    m: CacheRows<'_>,
    stride: usize,
    offset: usize,
    rows: Range<usize>,
    out: &mut [f32],
    out_stride: usize,
) {
    for (h0, gh) in passes(q.len(), d) {
        let qg = &q[h0 * d..(h0 + gh) * d];
        let og = &mut out[h0 * out_stride..];
        #[cfg(target_arch = "x86_64")]
        if avx2_f16c() {
            let mut rest = rows.clone();
            // One head alone runs faster in the 256-bit loop (measured on Zen 4, whose 512-bit
            // units are two 256-bit ones: `benches/attention.rs`); groups gain from the 32 zmm
            // registers, which hold every accumulator without spilling.
            if wide() && gh >= 2 {
                // SAFETY: AVX2, F16C, AVX-512F/DQ were detected at run time; slices are
                // bounds-checked inside.
                let done = unsafe {
                    match m {
                        CacheRows::F32(m) => wide::dot_group(qg, d, m, stride, offset, rest.clone(), og, out_stride),
                        CacheRows::F16(m) => wide::dot_group(qg, d, m, stride, offset, rest.clone(), og, out_stride),
                    }
                };
                rest.start += done;
            }
            if !rest.is_empty() {
                let og = &mut og[rest.start - rows.start..];
                // SAFETY: AVX2 and F16C were detected at run time; slices are bounds-checked inside.
                unsafe {
                    match m {
                        CacheRows::F32(m) => x86::dot_group(qg, d, m, stride, offset, rest, og, out_stride),
                        CacheRows::F16(m) => x86::dot_group(qg, d, m, stride, offset, rest, og, out_stride),
                    }
                }
            }
            continue;
        }
        with_row_buffer(d, |buf| {
            for (i, j) in rows.clone().enumerate() {
                let row = row_f32(m, j * stride + offset, d, buf);
                for h in 0..gh {
                    og[h * out_stride + i] = dot_f32(&qg[h * d..(h + 1) * d], row);
                }
            }
        });
    }
}

/// Attention output: for `g = out.len() / d` heads, `out_h += Σ_i p[h·p_stride + i] · row_(rows.start + i)`
/// (rows as in [`dot_rows_group`]). Equal bit for bit to repeated [`axpy_f32`] per head.
#[allow(clippy::too_many_arguments)]
pub fn weighted_rows_group(
    p: &[f32],
    p_stride: usize,
    m: CacheRows<'_>,
    stride: usize,
    offset: usize,
    rows: Range<usize>,
    out: &mut [f32],
    d: usize,
) {
    for (h0, gh) in passes(out.len(), d) {
        let pg = &p[h0 * p_stride..];
        let og = &mut out[h0 * d..(h0 + gh) * d];
        #[cfg(target_arch = "x86_64")]
        if wide() && d.is_multiple_of(16) {
            // SAFETY: AVX2, F16C, AVX-512F/DQ were detected at run time; slices are
            // bounds-checked inside.
            unsafe {
                match m {
                    CacheRows::F32(m) => wide::weighted_group(pg, p_stride, m, stride, offset, rows.clone(), og, d),
                    CacheRows::F16(m) => wide::weighted_group(pg, p_stride, m, stride, offset, rows.clone(), og, d),
                }
            }
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        if avx2_f16c() && d.is_multiple_of(8) {
            // SAFETY: AVX2 and F16C were detected at run time; slices are bounds-checked inside.
            unsafe {
                match m {
                    CacheRows::F32(m) => x86::weighted_group(pg, p_stride, m, stride, offset, rows.clone(), og, d),
                    CacheRows::F16(m) => x86::weighted_group(pg, p_stride, m, stride, offset, rows.clone(), og, d),
                }
            }
            continue;
        }
        with_row_buffer(d, |buf| {
            for (i, j) in rows.clone().enumerate() {
                let row = row_f32(m, j * stride + offset, d, buf);
                for h in 0..gh {
                    axpy_f32(pg[h * p_stride + i], row, &mut og[h * d..(h + 1) * d]);
                }
            }
        });
    }
}

/// The passes over `len / d` heads: (first head, heads) for at most [`MAX_GROUP`] at a time.
fn passes(len: usize, d: usize) -> impl Iterator<Item = (usize, usize)> {
    let g = len.checked_div(d).unwrap_or(0);
    (0..g).step_by(MAX_GROUP).map(move |h0| (h0, (g - h0).min(MAX_GROUP)))
}

/// The `d` values at `at` as f32: borrowed for an f32 cache, widened into `buf` for f16.
fn row_f32<'a>(m: CacheRows<'a>, at: usize, d: usize, buf: &'a mut [f32]) -> &'a [f32] {
    match m {
        CacheRows::F32(m) => &m[at..at + d],
        CacheRows::F16(m) => {
            for (o, &b) in buf.iter_mut().zip(&m[at..at + d]) {
                *o = f16_to_f32(b);
            }
            buf
        }
    }
}

/// Run `f` with an f32 buffer of `d` elements (on the stack for every usual head size).
fn with_row_buffer<R>(d: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut stack = [0f32; 512];
    if d <= stack.len() {
        f(&mut stack[..d])
    } else {
        f(&mut vec![0f32; d])
    }
}

/// Whether this CPU has AVX2, FMA and F16C (detected once).
#[cfg(target_arch = "x86_64")]
fn avx2_f16c() -> bool {
    crate::Features::get().avx2_fma_f16c()
}

/// Whether the 512-bit loops run (AVX-512F/DQ on top of AVX2/F16C; `ANELM_ATTN_WIDE=0` keeps the
/// 256-bit ones, for A/B runs).
#[cfg(target_arch = "x86_64")]
fn wide() -> bool {
    avx2_f16c() && wide::available() && crate::Tuning::get().attention_wide
}

#[cfg(target_arch = "x86_64")]
use crate::attention_rows_x86_wide as wide;

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::MAX_GROUP;
    use crate::fp16::f16_to_f32;

    /// Eight values of row `m` at `at` as f32, per storage type.
    pub(crate) trait Load8: Copy {
        /// # Safety
        /// AVX2 and F16C must be available; `m[at..at + 8]` must be in bounds (checked).
        unsafe fn load8(m: &[Self], at: usize) -> __m256;
        /// One value as f32.
        fn widen(self) -> f32;
    }

    impl Load8 for f32 {
        #[inline(always)]
        unsafe fn load8(m: &[f32], at: usize) -> __m256 {
            let c = &m[at..at + 8];
            // SAFETY: `c` holds exactly 8 f32; unaligned load; AVX is implied by the caller's AVX2.
            unsafe { _mm256_loadu_ps(c.as_ptr()) }
        }
        #[inline(always)]
        fn widen(self) -> f32 {
            self
        }
    }

    impl Load8 for u16 {
        #[inline(always)]
        unsafe fn load8(m: &[u16], at: usize) -> __m256 {
            let c = &m[at..at + 8];
            // SAFETY: `c` holds exactly 8 u16 (16 bytes); unaligned load; F16C per the caller.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(c.as_ptr().cast())) }
        }
        #[inline(always)]
        fn widen(self) -> f32 {
            f16_to_f32(self)
        }
    }

    /// Rows ahead of the one being read that the row loops prefetch.
    pub(crate) const ROWS_AHEAD: usize = 24;

    /// Hint the cache to fetch row `j` (its `d` values at `j·stride + offset`). The cached rows
    /// of a session are cold at every layer (the weight stream passed through the caches since
    /// they were last read) and a plane spans only a few pages, each of which the hardware
    /// prefetcher has to learn anew; without the hint the loops wait on every few rows.
    #[inline(always)]
    pub(crate) fn prefetch_row<T>(m: &[T], j: usize, stride: usize, offset: usize, d: usize) {
        let base = m.as_ptr().cast::<u8>();
        let at = (j * stride + offset) * std::mem::size_of::<T>();
        for line in (0..d * std::mem::size_of::<T>()).step_by(64) {
            // SAFETY: `_mm_prefetch` is baseline SSE and only a hint: it never faults and reads
            // nothing architecturally, so the address (possibly past the rows) needs no bounds.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(at + line).cast()) };
        }
    }

    /// Hint the first `ROWS_AHEAD` rows of `rows`, which the row loops' own hints (always
    /// `ROWS_AHEAD` rows on) do not cover; called once per block by the group entry points.
    #[inline(always)]
    pub(crate) fn prefetch_first_rows<T>(
        m: &[T],
        rows: &std::ops::Range<usize>,
        stride: usize,
        offset: usize,
        d: usize,
    ) {
        for j in rows.start..(rows.start + ROWS_AHEAD).min(rows.end) {
            prefetch_row(m, j, stride, offset, d);
        }
    }

    /// Per head the sequence of `vector::dot`: eight-lane partial sums over the chunks in order,
    /// the same horizontal reduction, then the tail in order. `R` rows at a time, so `R × G`
    /// independent accumulation chains hide the add latency.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn dot_block<T: Load8, const G: usize, const R: usize>(
        q: &[f32],
        d: usize,
        m: &[T],
        stride: usize,
        offset: usize,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
        out_stride: usize,
    ) {
        assert!(q.len() >= G * d);
        let split = d - d % 8;
        let (mut j, mut i) = (rows.start, 0);
        while j + R <= rows.end {
            for r in 0..R {
                prefetch_row(m, j + r + ROWS_AHEAD, stride, offset, d);
            }
            let mut acc = [[_mm256_setzero_ps(); G]; R];
            for c in (0..split).step_by(8) {
                let mut qv = [_mm256_setzero_ps(); G];
                for (h, v) in qv.iter_mut().enumerate() {
                    let qc = &q[h * d + c..h * d + c + 8];
                    // SAFETY: `qc` holds exactly 8 f32; unaligned load.
                    *v = unsafe { _mm256_loadu_ps(qc.as_ptr()) };
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    let at = (j + r) * stride + offset;
                    // SAFETY: `c + 8 ≤ d`, inside the row (bounds-checked in `load8`).
                    let row = unsafe { T::load8(m, at + c) };
                    for (a, qv) in a.iter_mut().zip(&qv) {
                        *a = _mm256_fmadd_ps(*qv, row, *a);
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                let row = &m[(j + r) * stride + offset..(j + r) * stride + offset + d];
                for (h, a) in a.iter().enumerate() {
                    let hsum = _mm_add_ps(_mm256_castps256_ps128(*a), _mm256_extractf128_ps::<1>(*a));
                    let t = _mm_hadd_ps(hsum, hsum);
                    let mut s = _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
                    for (x, y) in q[h * d + split..(h + 1) * d].iter().zip(&row[split..]) {
                        s = x.mul_add(y.widen(), s);
                    }
                    out[h * out_stride + i + r] = s;
                }
            }
            (j, i) = (j + R, i + R);
        }
        if R > 1 && j < rows.end {
            // SAFETY: same features; the remaining rows one at a time.
            unsafe { dot_block::<T, G, 1>(q, d, m, stride, offset, j..rows.end, &mut out[i..], out_stride) };
        }
    }

    /// Per output element the sequence of repeated `axpy`: `o + p·row` for each row in order.
    /// `C` chunks of eight outputs of each of the `G` heads in registers across the rows.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn weighted_block<T: Load8, const G: usize, const C: usize>(
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
        assert!(out.len() >= G * d && d.is_multiple_of(8) && chunks.end <= d / 8);
        let n = rows.len();
        for h in 0..G {
            assert!(h * p_stride + n <= p.len());
        }
        let mut c0 = chunks.start;
        while c0 + C <= chunks.end {
            let mut acc = [[_mm256_setzero_ps(); C]; G];
            for (h, a) in acc.iter_mut().enumerate() {
                for (cc, a) in a.iter_mut().enumerate() {
                    let oc = &out[h * d + 8 * (c0 + cc)..h * d + 8 * (c0 + cc) + 8];
                    // SAFETY: `oc` holds exactly 8 f32; unaligned load.
                    *a = unsafe { _mm256_loadu_ps(oc.as_ptr()) };
                }
            }
            for (i, j) in rows.clone().enumerate() {
                let at = j * stride + offset;
                if c0 == chunks.start {
                    prefetch_row(m, j + ROWS_AHEAD, stride, offset, d);
                }
                let mut w = [_mm256_setzero_ps(); G];
                for (h, w) in w.iter_mut().enumerate() {
                    *w = _mm256_set1_ps(p[h * p_stride + i]);
                }
                for cc in 0..C {
                    // SAFETY: `8·(c0 + cc) + 8 ≤ d`, inside the row (bounds-checked in `load8`).
                    let r = unsafe { T::load8(m, at + 8 * (c0 + cc)) };
                    for (a, w) in acc.iter_mut().zip(&w) {
                        a[cc] = _mm256_fmadd_ps(*w, r, a[cc]);
                    }
                }
            }
            for (h, a) in acc.iter().enumerate() {
                for (cc, a) in a.iter().enumerate() {
                    let oc = &mut out[h * d + 8 * (c0 + cc)..h * d + 8 * (c0 + cc) + 8];
                    // SAFETY: `oc` holds exactly 8 f32; unaligned store.
                    unsafe { _mm256_storeu_ps(oc.as_mut_ptr(), *a) };
                }
            }
            c0 += C;
        }
        if C > 1 && c0 < chunks.end {
            // SAFETY: same features; the remaining chunks one at a time.
            unsafe { weighted_block::<T, G, 1>(p, p_stride, m, stride, offset, rows, out, d, c0..chunks.end) };
        }
    }

    /// [`dot_block`] for `q.len() / d` (1 ..= MAX_GROUP) heads, rows per block picked so the
    /// accumulators fit the sixteen registers.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn dot_group<T: Load8>(
        q: &[f32],
        d: usize,
        m: &[T],
        stride: usize,
        offset: usize,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
        out_stride: usize,
    ) {
        prefetch_first_rows(m, &rows, stride, offset, d);
        // SAFETY (every arm): same features as this function.
        unsafe {
            match q.len() / d {
                1 => dot_block::<T, 1, 8>(q, d, m, stride, offset, rows, out, out_stride),
                2 => dot_block::<T, 2, 4>(q, d, m, stride, offset, rows, out, out_stride),
                3 => dot_block::<T, 3, 4>(q, d, m, stride, offset, rows, out, out_stride),
                4 => dot_block::<T, 4, 3>(q, d, m, stride, offset, rows, out, out_stride),
                5 => dot_block::<T, 5, 2>(q, d, m, stride, offset, rows, out, out_stride),
                6 => dot_block::<T, 6, 2>(q, d, m, stride, offset, rows, out, out_stride),
                7 => dot_block::<T, 7, 1>(q, d, m, stride, offset, rows, out, out_stride),
                8 => dot_block::<T, 8, 1>(q, d, m, stride, offset, rows, out, out_stride),
                g => unreachable!("{g} heads in one group (at most {MAX_GROUP})"),
            }
        }
    }

    /// [`weighted_block`] for `out.len() / d` (1 ..= MAX_GROUP) heads.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn weighted_group<T: Load8>(
        p: &[f32],
        p_stride: usize,
        m: &[T],
        stride: usize,
        offset: usize,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
        d: usize,
    ) {
        let all = 0..d / 8;
        prefetch_first_rows(m, &rows, stride, offset, d);
        // SAFETY (every arm): same features as this function.
        unsafe {
            match out.len() / d {
                1 => weighted_block::<T, 1, 8>(p, p_stride, m, stride, offset, rows, out, d, all),
                2 => weighted_block::<T, 2, 4>(p, p_stride, m, stride, offset, rows, out, d, all),
                3 => weighted_block::<T, 3, 4>(p, p_stride, m, stride, offset, rows, out, d, all),
                4 => weighted_block::<T, 4, 2>(p, p_stride, m, stride, offset, rows, out, d, all),
                5 => weighted_block::<T, 5, 2>(p, p_stride, m, stride, offset, rows, out, d, all),
                6 => weighted_block::<T, 6, 2>(p, p_stride, m, stride, offset, rows, out, d, all),
                7 => weighted_block::<T, 7, 1>(p, p_stride, m, stride, offset, rows, out, d, all),
                8 => weighted_block::<T, 8, 1>(p, p_stride, m, stride, offset, rows, out, d, all),
                g => unreachable!("{g} heads in one group (at most {MAX_GROUP})"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vector::tests::data;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The 256-bit loops called directly: where the 512-bit ones run, the dispatcher leaves
    /// them only odd rows and head widths that are not a multiple of 16.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn narrow_loops_equal_per_head_dots_and_axpys_bit_for_bit() {
        if !avx2_f16c() {
            eprintln!("no AVX2/F16C here: the 256-bit loops are not used on this CPU");
            return;
        }
        for d in [8usize, 24, 64] {
            for g in 1usize..=8 {
                let stride = d + 1;
                let m16: Vec<u16> = data(stride * 30, 12).iter().map(|&x| crate::f32_to_f16(x)).collect();
                let m16w: Vec<f32> = m16.iter().map(|&b| f16_to_f32(b)).collect();
                let (q, ps, rows) = (data(g * d, 13), 30, 1..28);
                let p = data(g * ps, 14);
                let mut got = vec![0.0; g * ps];
                let mut out = data(g * d, 15);
                let mut want_out = out.clone();
                // SAFETY: AVX2 and F16C were detected above.
                unsafe {
                    x86::dot_group(&q, d, &m16, stride, 1, rows.clone(), &mut got, ps);
                    x86::weighted_group(&p, ps, &m16, stride, 1, rows.clone(), &mut out, d);
                }
                for h in 0..g {
                    for (i, j) in rows.clone().enumerate() {
                        let row = &m16w[j * stride + 1..j * stride + 1 + d];
                        assert_eq!(
                            got[h * ps + i].to_bits(),
                            dot_f32(&q[h * d..(h + 1) * d], row).to_bits()
                        );
                        axpy_f32(p[h * ps + i], row, &mut want_out[h * d..(h + 1) * d]);
                    }
                }
                assert_eq!(bits(&out), bits(&want_out), "weighted d={d} g={g}");
            }
        }
    }

    #[test]
    fn group_kernels_equal_per_head_dots_and_axpys_bit_for_bit() {
        for d in [8usize, 24, 64, 128, 256, 7, 300] {
            for g in 1usize..=9 {
                let stride = d + 5;
                let m32 = data(stride * 40, 4);
                let m16: Vec<u16> = m32.iter().map(|&x| crate::f32_to_f16(x * 3.0)).collect();
                let m16w: Vec<f32> = m16.iter().map(|&b| f16_to_f32(b)).collect();
                let q = data(g * d, 5);
                let (rows, n, ps) = (2..33, 31, 40);
                let p = data(g * ps, 6);
                for (m, wide) in [(CacheRows::F32(&m32), &m32), (CacheRows::F16(&m16), &m16w)] {
                    let mut got = vec![0.0; g * ps];
                    dot_rows_group(&q, d, m, stride, 3, rows.clone(), &mut got, ps);
                    let mut out = data(g * d, 7);
                    let mut want_out = out.clone();
                    weighted_rows_group(&p, ps, m, stride, 3, rows.clone(), &mut out, d);
                    for h in 0..g {
                        let qh = &q[h * d..(h + 1) * d];
                        for (i, j) in rows.clone().enumerate() {
                            let row = &wide[j * stride + 3..j * stride + 3 + d];
                            assert_eq!(
                                got[h * ps + i].to_bits(),
                                dot_f32(qh, row).to_bits(),
                                "dot d={d} g={g} head {h} row {j}"
                            );
                            axpy_f32(p[h * ps + i], row, &mut want_out[h * d..(h + 1) * d]);
                        }
                        assert!(
                            got[h * ps + n..(h + 1) * ps].iter().all(|&x| x == 0.0),
                            "wrote past the rows"
                        );
                    }
                    assert_eq!(bits(&out), bits(&want_out), "weighted d={d} g={g}");
                }
            }
        }
    }
}
