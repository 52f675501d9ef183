//! f32 vector primitives for the CPU-side model ops (attention over the KV cache: q·k scores and
//! the probability-weighted sum of V rows). The portable code is written so the compiler can
//! vectorise it; on x86-64 an AVX2 path is picked at run time (the crates are built for baseline
//! x86-64, which has only SSE2). Both paths use the same eight-lane order with separate multiply
//! and add (no FMA), so their results are equal bit for bit.

/// `Σ a[i]·b[i]` over `a.len()` elements (`b` may be longer): eight interleaved partial sums,
/// combined as `((s0+s4)+(s1+s5))+((s2+s6)+(s3+s7))`, then the tail in order.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let b = &b[..a.len()];
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 was detected at run time.
        return unsafe { x86::dot(a, b) };
    }
    dot_portable(a, b)
}

/// `y[i] += alpha · x[i]` for `i < y.len()` (`x` may be longer).
#[inline]
pub fn axpy_f32(alpha: f32, x: &[f32], y: &mut [f32]) {
    let x = &x[..y.len()];
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 was detected at run time.
        unsafe { x86::axpy(alpha, x, y) };
        return;
    }
    for (o, v) in y.iter_mut().zip(x) {
        *o += alpha * v;
    }
}

/// Attention scores: for each row `j` in `rows`, push `q · m[j·stride + offset ..][..q.len()]`
/// onto `out`, equal bit for bit to [`dot_f32`] per row (reduced in registers on AVX2).
pub fn dot_rows_f32(
    q: &[f32],
    m: &[f32],
    stride: usize,
    offset: usize,
    rows: std::ops::Range<usize>,
    out: &mut Vec<f32>,
) {
    let d = q.len();
    for j in rows {
        out.push(dot_f32(q, &m[j * stride + offset..j * stride + offset + d]));
    }
}

/// The attention output: `out += Σ_i p[i] · m[(rows.start + i)·stride + offset ..][..out.len()]`
/// over `rows` (`p` holds one weight per row, in order), equal bit for bit to repeated
/// [`axpy_f32`] (the output kept in registers across rows on AVX2).
pub fn weighted_rows_f32(
    p: &[f32],
    m: &[f32],
    stride: usize,
    offset: usize,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let d = out.len();
    #[cfg(target_arch = "x86_64")]
    if avx2() && d.is_multiple_of(8) && d <= 256 {
        // SAFETY: AVX2 was detected at run time; rows are bounds-checked inside.
        unsafe { x86::weighted_in_registers(p, m, stride, offset, rows, out) };
        return;
    }
    for (pi, j) in p.iter().zip(rows) {
        axpy_f32(*pi, &m[j * stride + offset..j * stride + offset + d], out);
    }
}

/// [`dot_rows_f32`] over rows stored as f16 bits (a half-precision KV cache): equal bit for bit
/// to converting each row to f32 first (the conversion is exact), without the copy on AVX2.
pub fn dot_rows_f16(
    q: &[f32],
    m: &[u16],
    stride: usize,
    offset: usize,
    rows: std::ops::Range<usize>,
    out: &mut Vec<f32>,
) {
    let d = q.len();
    #[cfg(target_arch = "x86_64")]
    if avx2_f16c() {
        for j in rows {
            let row = &m[j * stride + offset..j * stride + offset + d];
            // SAFETY: AVX2 and F16C were detected at run time; `row` has `q.len()` elements.
            out.push(unsafe { x86::dot_f16(q, row) });
        }
        return;
    }
    with_f32_row(d, |buf| {
        for j in rows {
            widen(&m[j * stride + offset..j * stride + offset + d], buf);
            out.push(dot_f32(q, buf));
        }
    });
}

/// [`weighted_rows_f32`] over rows stored as f16 bits: equal bit for bit to converting each row
/// to f32 first.
pub fn weighted_rows_f16(
    p: &[f32],
    m: &[u16],
    stride: usize,
    offset: usize,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let d = out.len();
    #[cfg(target_arch = "x86_64")]
    if avx2_f16c() && d.is_multiple_of(8) && d <= 256 {
        // SAFETY: AVX2 and F16C were detected at run time; rows are bounds-checked inside.
        unsafe { x86::weighted_in_registers_f16(p, m, stride, offset, rows, out) };
        return;
    }
    with_f32_row(d, |buf| {
        for (pi, j) in p.iter().zip(rows) {
            widen(&m[j * stride + offset..j * stride + offset + d], buf);
            axpy_f32(*pi, buf, out);
        }
    });
}

/// f16 bits → f32 (exact), element by element.
fn widen(src: &[u16], dst: &mut [f32]) {
    for (d, &b) in dst.iter_mut().zip(src) {
        *d = crate::fp16::f16_to_f32(b);
    }
}

/// Run `f` with an f32 buffer of `d` elements (on the stack for every usual head size).
fn with_f32_row<R>(d: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut stack = [0f32; 512];
    if d <= stack.len() {
        f(&mut stack[..d])
    } else {
        f(&mut vec![0f32; d])
    }
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let split = a.len() - a.len() % 8;
    for (x, y) in a[..split].chunks_exact(8).zip(b[..split].chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in a[split..].iter().zip(&b[split..]) {
        s += x * y;
    }
    s
}

/// Whether this CPU runs AVX2 (detected once).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx2"))
}

/// Whether this CPU runs AVX2 and F16C (detected once).
#[cfg(target_arch = "x86_64")]
fn avx2_f16c() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| avx2() && is_x86_feature_detected!("f16c"))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Eight f16 values at `b[at..at + 8]` as f32.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn load_f16x8(b: &[u16], at: usize) -> __m256 {
        let chunk = &b[at..at + 8];
        // SAFETY: `chunk` holds exactly 8 u16 (16 bytes); unaligned load.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(chunk.as_ptr().cast()) })
    }

    /// `dot` with `b` in f16: the same sums in the same order on the exactly widened values.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn dot_f16(a: &[f32], b: &[u16]) -> f32 {
        let split = a.len() - a.len() % 8;
        let mut acc = _mm256_setzero_ps();
        for (i, x) in a[..split].chunks_exact(8).enumerate() {
            // SAFETY: the chunk holds exactly 8 f32; unaligned load.
            let xv = unsafe { _mm256_loadu_ps(x.as_ptr()) };
            acc = _mm256_add_ps(acc, _mm256_mul_ps(xv, load_f16x8(b, 8 * i)));
        }
        let h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
        let t = _mm_hadd_ps(h, h);
        let mut s = _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
        for (x, &y) in a[split..].iter().zip(&b[split..a.len()]) {
            s += x * crate::fp16::f16_to_f32(y);
        }
        s
    }

    /// `weighted_in_registers` with the rows in f16.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn weighted_in_registers_f16(
        p: &[f32],
        m: &[u16],
        stride: usize,
        offset: usize,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        const MAX: usize = 32;
        let n = out.len() / 8;
        assert!(out.len().is_multiple_of(8) && n <= MAX);
        let mut acc = [_mm256_setzero_ps(); MAX];
        for (c, a) in acc.iter_mut().enumerate().take(n) {
            // SAFETY: chunk `c < n` lies inside `out`.
            *a = unsafe { _mm256_loadu_ps(out.as_ptr().add(8 * c)) };
        }
        for (pi, j) in p.iter().zip(rows) {
            let row = &m[j * stride + offset..j * stride + offset + out.len()];
            let w = _mm256_set1_ps(*pi);
            for (c, a) in acc.iter_mut().enumerate().take(n) {
                *a = _mm256_add_ps(*a, _mm256_mul_ps(w, load_f16x8(row, 8 * c)));
            }
        }
        for (c, a) in acc.iter().enumerate().take(n) {
            // SAFETY: chunk `c < n` lies inside `out`.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * c), *a) };
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
        let split = a.len() - a.len() % 8;
        let mut acc = _mm256_setzero_ps();
        for (x, y) in a[..split].chunks_exact(8).zip(b[..split].chunks_exact(8)) {
            // SAFETY: both chunks hold exactly 8 f32; unaligned loads.
            let (xv, yv) = unsafe { (_mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(y.as_ptr())) };
            acc = _mm256_add_ps(acc, _mm256_mul_ps(xv, yv));
        }
        // [s0+s4, s1+s5, s2+s6, s3+s7], then ((s0+s4)+(s1+s5)) + ((s2+s6)+(s3+s7)), in registers.
        let h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
        let t = _mm_hadd_ps(h, h);
        let mut s = _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
        for (x, y) in a[split..].iter().zip(&b[split..]) {
            s += x * y;
        }
        s
    }

    /// `out += Σ p[i] · row(rows.start + i)` with `out` (≤ 256 floats, a multiple of 8) held in
    /// registers; per element the same multiply-then-add sequence as repeated `axpy`.
    #[target_feature(enable = "avx2")]
    pub(super) fn weighted_in_registers(
        p: &[f32],
        m: &[f32],
        stride: usize,
        offset: usize,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        const MAX: usize = 32;
        let n = out.len() / 8;
        assert!(out.len().is_multiple_of(8) && n <= MAX);
        let mut acc = [_mm256_setzero_ps(); MAX];
        for (c, a) in acc.iter_mut().enumerate().take(n) {
            // SAFETY: chunk `c < n` lies inside `out`.
            *a = unsafe { _mm256_loadu_ps(out.as_ptr().add(8 * c)) };
        }
        for (pi, j) in p.iter().zip(rows) {
            let row = &m[j * stride + offset..j * stride + offset + out.len()];
            let w = _mm256_set1_ps(*pi);
            for (c, a) in acc.iter_mut().enumerate().take(n) {
                // SAFETY: chunk `c < n` lies inside `row` (same length as `out`).
                *a = _mm256_add_ps(
                    *a,
                    _mm256_mul_ps(w, unsafe { _mm256_loadu_ps(row.as_ptr().add(8 * c)) }),
                );
            }
        }
        for (c, a) in acc.iter().enumerate().take(n) {
            // SAFETY: chunk `c < n` lies inside `out`.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * c), *a) };
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
        let split = y.len() - y.len() % 8;
        let av = _mm256_set1_ps(alpha);
        for (o, v) in y[..split].chunks_exact_mut(8).zip(x[..split].chunks_exact(8)) {
            // SAFETY: both chunks hold exactly 8 f32; unaligned loads and store.
            unsafe {
                let r = _mm256_add_ps(
                    _mm256_loadu_ps(o.as_ptr()),
                    _mm256_mul_ps(av, _mm256_loadu_ps(v.as_ptr())),
                );
                _mm256_storeu_ps(o.as_mut_ptr(), r);
            }
        }
        for (o, v) in y[split..].iter_mut().zip(&x[split..]) {
            *o += alpha * v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / (1 << 24) as f32 - 0.5)
            .collect()
    }

    #[test]
    fn dispatched_paths_equal_the_portable_ones_bit_for_bit() {
        for n in [0usize, 1, 7, 8, 9, 63, 64, 65, 128, 257] {
            let (a, b) = (data(n, 1), data(n + 3, 2));
            assert_eq!(
                dot_f32(&a, &b).to_bits(),
                dot_portable(&a, &b[..n]).to_bits(),
                "dot n={n}"
            );
            let mut y = data(n, 3);
            let mut want = y.clone();
            axpy_f32(0.37, &b, &mut y);
            for (o, v) in want.iter_mut().zip(&b) {
                *o += 0.37 * v;
            }
            assert_eq!(y, want, "axpy n={n}");
        }
    }

    #[test]
    fn row_kernels_equal_per_row_dots_and_axpys_bit_for_bit() {
        for d in [8usize, 24, 64, 128, 256, 7, 300] {
            let stride = d + 5;
            let m = data(stride * 40, 4);
            let q = data(d, 5);
            let p = data(31, 6);
            let mut got = Vec::new();
            dot_rows_f32(&q, &m, stride, 3, 2..33, &mut got);
            assert_eq!(got.len(), 31);
            for (i, g) in got.iter().enumerate() {
                let j = 2 + i;
                let want = dot_f32(&q, &m[j * stride + 3..j * stride + 3 + d]);
                assert!(
                    (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "dot d={d} row {j}: {g} vs {want}"
                );
            }
            let mut out = data(d, 7);
            let mut want = out.clone();
            weighted_rows_f32(&p, &m, stride, 3, 2..33, &mut out);
            for (i, &pi) in p.iter().enumerate() {
                let j = 2 + i;
                axpy_f32(pi, &m[j * stride + 3..j * stride + 3 + d], &mut want);
            }
            assert_eq!(out, want, "weighted d={d}");
        }
    }

    #[test]
    fn f16_row_kernels_equal_the_f32_ones_on_widened_rows_bit_for_bit() {
        for d in [8usize, 24, 64, 128, 256, 7, 300] {
            let stride = d + 5;
            let m16: Vec<u16> = data(stride * 40, 8)
                .iter()
                .map(|&x| crate::f32_to_f16(x * 3.0))
                .collect();
            let m32: Vec<f32> = m16.iter().map(|&b| crate::f16_to_f32(b)).collect();
            let (q, p) = (data(d, 9), data(31, 10));
            let (mut got, mut want) = (Vec::new(), Vec::new());
            dot_rows_f16(&q, &m16, stride, 3, 2..33, &mut got);
            dot_rows_f32(&q, &m32, stride, 3, 2..33, &mut want);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "dot d={d}");
            let (mut o16, mut o32) = (data(d, 11), data(d, 11));
            weighted_rows_f16(&p, &m16, stride, 3, 2..33, &mut o16);
            weighted_rows_f32(&p, &m32, stride, 3, 2..33, &mut o32);
            assert_eq!(bits(&o16), bits(&o32), "weighted d={d}");
        }
    }

    #[test]
    fn dot_is_the_dot_product() {
        let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
        let b = [1.0f32; 9];
        assert_eq!(dot_f32(&a, &b), 45.0);
    }
}
