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

/// Queries from which [`dot_rows_group`] scores with the rows in the vector lanes
/// (`attention_keys_x86`: each block of rows transposed once for all the queries) rather than
/// the row loops. A decode step's group (at most eight heads) stays on the row loops; a prefill
/// tile (tokens × heads of one KV head) goes to the keys-in-lanes kernel.
#[cfg(target_arch = "x86_64")]
const KEYS_IN_LANES_FROM: usize = 9;

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
    #[cfg(target_arch = "x86_64")]
    if wide() && q.len() / d.max(1) >= KEYS_IN_LANES_FROM && rows.len() >= 16 {
        // SAFETY: AVX2, FMA, F16C, AVX-512F/DQ were detected at run time; slices are
        // bounds-checked inside.
        unsafe {
            match m {
                CacheRows::F32(m) => keys::dot_keys_avx512(q, d, m, stride, offset, rows, out, out_stride),
                CacheRows::F16(m) => keys::dot_keys_avx512(q, d, m, stride, offset, rows, out, out_stride),
            }
        }
        return;
    }
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
                        CacheRows::F32(m) => {
                            x86::dot_group_avx512(qg, d, m, stride, offset, rest.clone(), og, out_stride)
                        }
                        CacheRows::F16(m) => {
                            x86::dot_group_avx512(qg, d, m, stride, offset, rest.clone(), og, out_stride)
                        }
                    }
                };
                rest.start += done;
            }
            if !rest.is_empty() {
                let og = &mut og[rest.start - rows.start..];
                // SAFETY: AVX2 and F16C were detected at run time; slices are bounds-checked inside.
                unsafe {
                    match m {
                        CacheRows::F32(m) => x86::dot_group_avx2(qg, d, m, stride, offset, rest, og, out_stride),
                        CacheRows::F16(m) => x86::dot_group_avx2(qg, d, m, stride, offset, rest, og, out_stride),
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

/// Rows a block of [`weighted_rows_group`] takes through every pass before the next block.
const WEIGHTED_ROW_BLOCK: usize = 64;

/// Attention output: for `g = out.len() / d` heads, `out_h += Σ_i p[h·p_stride + i] · row_(rows.start + i)`
/// (rows as in [`dot_rows_group`]). Equal bit for bit to repeated [`axpy_f32`] per head.
///
/// More than [`MAX_GROUP`] heads (a prefill tile's queries) take several passes, each over a
/// few registers' width of the heads' outputs; the rows then go in blocks of
/// [`WEIGHTED_ROW_BLOCK`], every pass over a block before the next (each block read from the
/// caches, not from memory, by all but the first pass). Each output still adds its rows in
/// order, so the bits are those of one pass over all rows.
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
    let heads = out.len().checked_div(d).unwrap_or(0);
    let block = if heads > MAX_GROUP {
        WEIGHTED_ROW_BLOCK
    } else {
        rows.len().max(1)
    };
    let mut b0 = rows.start;
    while b0 < rows.end {
        let b1 = (b0 + block).min(rows.end);
        let (p, rows) = (&p[b0 - rows.start..], b0..b1);
        b0 = b1;
        for (h0, gh) in passes(out.len(), d) {
            let pg = &p[h0 * p_stride..];
            let og = &mut out[h0 * d..(h0 + gh) * d];
            #[cfg(target_arch = "x86_64")]
            if wide() && d.is_multiple_of(16) {
                // SAFETY: AVX2, F16C, AVX-512F/DQ were detected at run time; slices are
                // bounds-checked inside.
                unsafe {
                    match m {
                        CacheRows::F32(m) => {
                            x86::weighted_group_avx512(pg, p_stride, m, stride, offset, rows.clone(), og, d)
                        }
                        CacheRows::F16(m) => {
                            x86::weighted_group_avx512(pg, p_stride, m, stride, offset, rows.clone(), og, d)
                        }
                    }
                }
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            if avx2_f16c() && d.is_multiple_of(8) {
                // SAFETY: AVX2 and F16C were detected at run time; slices are bounds-checked inside.
                unsafe {
                    match m {
                        CacheRows::F32(m) => {
                            x86::weighted_group_avx2(pg, p_stride, m, stride, offset, rows.clone(), og, d)
                        }
                        CacheRows::F16(m) => {
                            x86::weighted_group_avx2(pg, p_stride, m, stride, offset, rows.clone(), og, d)
                        }
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
    crate::lanes_x86::Avx2::detect().is_some()
}

/// Whether the 512-bit loops run (AVX-512F/DQ on top of AVX2/F16C; `ANELM_ATTN_WIDE=0` keeps the
/// 256-bit ones, for A/B runs).
#[cfg(target_arch = "x86_64")]
fn wide() -> bool {
    crate::lanes_x86::Avx512::detect().is_some() && crate::Tuning::get().attention_wide
}

#[cfg(target_arch = "x86_64")]
use crate::attention_keys_x86 as keys;
#[cfg(target_arch = "x86_64")]
use crate::attention_rows_x86 as x86;

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
                    x86::dot_group_avx2(&q, d, &m16, stride, 1, rows.clone(), &mut got, ps);
                    x86::weighted_group_avx2(&p, ps, &m16, stride, 1, rows.clone(), &mut out, d);
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

    /// A tile's worth of heads (more than one pass) over more rows than a block: the rows go in
    /// blocks, and every output has the bits of per-head axpys over all rows in order.
    #[test]
    fn many_heads_over_many_rows_weigh_in_blocks_bit_for_bit() {
        for d in [16usize, 256, 24] {
            for g in [9usize, 20, 32] {
                let (stride, nrows) = (d + 3, 150);
                let m32 = data(stride * (nrows + 5), 11);
                let m16: Vec<u16> = m32.iter().map(|&x| crate::f32_to_f16(x * 3.0)).collect();
                let m16w: Vec<f32> = m16.iter().map(|&b| f16_to_f32(b)).collect();
                let rows = 4..4 + nrows;
                let ps = nrows + 7;
                let p = data(g * ps, 12);
                for (m, wide) in [(CacheRows::F32(&m32), &m32), (CacheRows::F16(&m16), &m16w)] {
                    let mut out = data(g * d, 13);
                    let mut want = out.clone();
                    weighted_rows_group(&p, ps, m, stride, 2, rows.clone(), &mut out, d);
                    for h in 0..g {
                        for (i, j) in rows.clone().enumerate() {
                            let row = &wide[j * stride + 2..j * stride + 2 + d];
                            axpy_f32(p[h * ps + i], row, &mut want[h * d..(h + 1) * d]);
                        }
                    }
                    assert_eq!(bits(&out), bits(&want), "weighted d={d} g={g}");
                }
            }
        }
    }
}
