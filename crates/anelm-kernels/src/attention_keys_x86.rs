//! Attention scores of many queries at once with the keys in the vector lanes (AVX-512): the
//! prefill path of [`crate::dot_rows_group`], where a tile of tokens × the query heads of one KV
//! head score the same cached rows.
//!
//! The row loops of `attention_rows_x86` hold the query's channels in the lanes, so every
//! (query, row) score ends in a horizontal reduction and every row is widened from f16 once per
//! group of at most eight heads. Here sixteen rows are widened and transposed once per block
//! (channel-major: lane `r` of vector `c` is channel `c` of row `r`) and every query of the call
//! then scores the sixteen rows with one FMA per channel and no shuffles: `dot_f32`'s eight
//! partial sums (channels `c ≡ i (mod 8)`, in order) are eight vectors over the rows, combined
//! with the same adds in the same order, then the tail channels fused in order. Each score is
//! therefore bit-identical to [`crate::dot_f32`] of the query and the widened row, as the row
//! loops' are; only the work per score changes.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::lanes_x86::CacheValue;

/// Rows per block: one 512-bit vector of f32 scores.
const KEYS: usize = 16;

/// Queries per register pass: eight partial-sum vectors each (24 of the 32 registers).
const PASS: usize = 3;

thread_local! {
    /// The transposed block of rows (`d` vectors of [`KEYS`] f32).
    static BLOCK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `out[h·out_stride + (j − rows.start)] = q_h · row_j` for the `q.len() / d` queries (any
/// number) and the rows `rows` (row `j` is the `d` values at `m[j·stride + offset ..]`),
/// bit-identical to `dot_f32` per query and row.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512F and AVX-512DQ must be available (slices are bounds-checked).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn dot_keys_avx512<T: CacheValue>(
    q: &[f32],
    d: usize,
    m: &[T],
    stride: usize,
    offset: usize,
    rows: Range<usize>,
    out: &mut [f32],
    out_stride: usize,
) {
    let nq = q.len() / d;
    if nq == 0 || rows.is_empty() {
        return;
    }
    let n = rows.len();
    assert!(out.len() >= (nq - 1) * out_stride + n, "score rows too short");
    BLOCK.with(|block| {
        let mut block = block.borrow_mut();
        block.resize(d * KEYS, 0.0);
        let mut j0 = rows.start;
        while j0 < rows.end {
            let nk = (rows.end - j0).min(KEYS);
            transpose_block(m, stride, offset, j0, nk, d, &mut block);
            let at = j0 - rows.start;
            let mut h = 0;
            while h < nq {
                let left = nq - h;
                let qs = &q[h * d..];
                let o = &mut out[h * out_stride + at..];
                match left {
                    1 => score_pass::<1>(qs, d, &block, o, out_stride, nk),
                    2 => score_pass::<2>(qs, d, &block, o, out_stride, nk),
                    _ => score_pass::<PASS>(qs, d, &block, o, out_stride, nk),
                }
                h += left.min(PASS);
            }
            j0 += nk;
        }
    });
}

/// Rows `j0 .. j0 + nk` (`nk ≤ 16`) widened to f32 and stored channel-major in `block`:
/// `block[c·16 + r]` = channel `c` of row `j0 + r`, zero for `r ≥ nk`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512dq")]
fn transpose_block<T: CacheValue>(
    m: &[T],
    stride: usize,
    offset: usize,
    j0: usize,
    nk: usize,
    d: usize,
    block: &mut [f32],
) {
    let whole = d - d % KEYS;
    for c0 in (0..whole).step_by(KEYS) {
        let mut r: [__m512; KEYS] = [_mm512_setzero_ps(); KEYS];
        for (i, v) in r.iter_mut().enumerate().take(nk) {
            // SAFETY: AVX-512F per this function's features; `load16` checks the bounds.
            *v = unsafe { T::load16(m, (j0 + i) * stride + offset + c0) };
        }
        let t = transpose16(r);
        for (i, v) in t.iter().enumerate() {
            let dst = &mut block[(c0 + i) * KEYS..(c0 + i + 1) * KEYS];
            // SAFETY: `dst` holds exactly 16 f32; unaligned store.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), *v) };
        }
    }
    for c in whole..d {
        for r in 0..KEYS {
            block[c * KEYS + r] = if r < nk {
                m[(j0 + r) * stride + offset + c].widen()
            } else {
                0.0
            };
        }
    }
}

/// A 16 × 16 transpose of f32: lane `c` of output `r` is lane `r` of input `c`.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    // Pairs of rows interleaved within each 128-bit lane ...
    let mut t = [_mm512_setzero_ps(); 16];
    for p in 0..8 {
        t[2 * p] = _mm512_unpacklo_ps(r[2 * p], r[2 * p + 1]);
        t[2 * p + 1] = _mm512_unpackhi_ps(r[2 * p], r[2 * p + 1]);
    }
    // ... then pairs of those as 64-bit elements: `u[4g + k]`, 128-bit lane `L`, holds channel
    // `4L + k` of rows `4g .. 4g + 4`.
    let mut u = [_mm512_setzero_ps(); 16];
    for g in 0..4 {
        let (a, b, c, e) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
        let pd = |x: __m512| _mm512_castps_pd(x);
        u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(a), pd(c)));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(a), pd(c)));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(b), pd(e)));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(b), pd(e)));
    }
    // A 4 × 4 transpose of 128-bit lanes over the four row groups, per `k`.
    let mut out = [_mm512_setzero_ps(); 16];
    for k in 0..4 {
        let (a, b, c, e) = (u[k], u[4 + k], u[8 + k], u[12 + k]);
        let v0 = _mm512_shuffle_f32x4::<0x44>(a, b);
        let v1 = _mm512_shuffle_f32x4::<0xEE>(a, b);
        let v2 = _mm512_shuffle_f32x4::<0x44>(c, e);
        let v3 = _mm512_shuffle_f32x4::<0xEE>(c, e);
        out[k] = _mm512_shuffle_f32x4::<0x88>(v0, v2);
        out[4 + k] = _mm512_shuffle_f32x4::<0xDD>(v0, v2);
        out[8 + k] = _mm512_shuffle_f32x4::<0x88>(v1, v3);
        out[12 + k] = _mm512_shuffle_f32x4::<0xDD>(v1, v3);
    }
    out
}

/// `Q` queries (at `q`, `d` apart) against one transposed block: `dot_f32`'s eight partial sums
/// per query as eight vectors over the block's rows, its combination, its fused tail; the
/// first `nk` scores of query `h` go to `out[h·out_stride ..]`.
#[inline(always)]
fn score_pass<const Q: usize>(q: &[f32], d: usize, block: &[f32], out: &mut [f32], out_stride: usize, nk: usize) {
    assert!(q.len() >= Q * d && block.len() >= d * KEYS);
    let split = d - d % 8;
    // SAFETY (every block below): AVX-512F is enabled in the calling kernels; the loads read
    // `block[c·16 .. c·16 + 16]` with `c < d` and `q[h·d + c]` with `h < Q`, `c < d`, inside
    // the slices asserted above; stores are bounds-checked slices.
    unsafe {
        let kv = |c: usize| _mm512_loadu_ps(block.as_ptr().add(c * KEYS));
        let qv = |h: usize, c: usize| _mm512_set1_ps(*q.get_unchecked(h * d + c));
        let mut acc = [[_mm512_setzero_ps(); 8]; Q];
        for c0 in (0..split).step_by(8) {
            for i in 0..8 {
                let k = kv(c0 + i);
                for (h, a) in acc.iter_mut().enumerate() {
                    a[i] = _mm512_fmadd_ps(qv(h, c0 + i), k, a[i]);
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            let lo = _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[1], a[5]));
            let hi = _mm512_add_ps(_mm512_add_ps(a[2], a[6]), _mm512_add_ps(a[3], a[7]));
            let mut s = _mm512_add_ps(lo, hi);
            for c in split..d {
                s = _mm512_fmadd_ps(qv(h, c), kv(c), s);
            }
            let dst = &mut out[h * out_stride..h * out_stride + nk];
            let mask: __mmask16 = if nk >= KEYS { 0xFFFF } else { (1u16 << nk) - 1 };
            _mm512_mask_storeu_ps(dst.as_mut_ptr(), mask, s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fp16::f16_to_f32;
    use crate::vector::dot_f32;
    use crate::vector::tests::data;

    fn avx512() -> bool {
        crate::lanes_x86::Avx512::detect().is_some()
    }

    #[test]
    fn transpose16_moves_every_lane() {
        if !avx512() {
            eprintln!("no AVX-512 here: the keys-in-lanes scores are not used on this CPU");
            return;
        }
        let vals: Vec<f32> = (0..256).map(|i| i as f32).collect();
        // SAFETY: AVX-512F was detected above.
        let got = unsafe {
            let r: [__m512; 16] = std::array::from_fn(|i| _mm512_loadu_ps(vals[16 * i..].as_ptr()));
            transpose16(r)
        };
        for (c, v) in got.iter().enumerate() {
            let mut lanes = [0f32; 16];
            // SAFETY: as above; 16 f32 stored.
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *v) };
            for (r, &x) in lanes.iter().enumerate() {
                assert_eq!(x, vals[16 * r + c], "lane {r} of output {c}");
            }
        }
    }

    #[test]
    fn scores_equal_dot_f32_bit_for_bit() {
        if !avx512() {
            eprintln!("no AVX-512 here: the keys-in-lanes scores are not used on this CPU");
            return;
        }
        for d in [8usize, 20, 64, 72, 256] {
            for nq in [1usize, 2, 3, 4, 7, 12] {
                let stride = d + 3;
                let n_rows = 53;
                let m32 = data(stride * n_rows, 21);
                let m16: Vec<u16> = m32.iter().map(|&x| crate::f32_to_f16(x)).collect();
                let q = data(nq * d, 22);
                for rows in [0..n_rows, 5..38, 17..18, 3..19] {
                    let ps = rows.len() + 2;
                    let mut got32 = vec![f32::NAN; nq * ps];
                    let mut got16 = vec![f32::NAN; nq * ps];
                    // SAFETY: AVX-512F/DQ (and so AVX2, FMA, F16C) were detected above.
                    unsafe {
                        dot_keys_avx512(&q, d, &m32, stride, 2, rows.clone(), &mut got32, ps);
                        dot_keys_avx512(&q, d, &m16, stride, 2, rows.clone(), &mut got16, ps);
                    }
                    for h in 0..nq {
                        let qh = &q[h * d..(h + 1) * d];
                        for (i, j) in rows.clone().enumerate() {
                            let at = j * stride + 2;
                            let w16: Vec<f32> = m16[at..at + d].iter().map(|&b| f16_to_f32(b)).collect();
                            assert_eq!(got32[h * ps + i].to_bits(), dot_f32(qh, &m32[at..at + d]).to_bits());
                            assert_eq!(got16[h * ps + i].to_bits(), dot_f32(qh, &w16).to_bits());
                        }
                        // Nothing written past the rows.
                        assert!(got32[h * ps + rows.len()..(h + 1) * ps].iter().all(|x| x.is_nan()));
                    }
                }
            }
        }
    }
}
