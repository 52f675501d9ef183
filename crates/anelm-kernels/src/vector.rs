//! f32 vector primitives for the CPU-side model ops (the per-head arithmetic of attention over
//! the KV cache, see `attention_rows`). The portable code is written so the compiler can
//! vectorise it; on x86-64 an AVX2 path is picked at run time (the crates are built for baseline
//! x86-64, which has only SSE2). Both paths use the same eight-lane order with fused
//! multiply-adds (one rounding per term, as `f32::mul_add`), so their results are equal bit for
//! bit. Fused, because the attention loops built on them are bound by their vector ports: an
//! FMA is one instruction where a multiply and an add are two (docs/field-guide.md).

/// `Σ a[i]·b[i]` over `a.len()` elements (`b` may be longer): eight interleaved partial sums
/// (`s ← fma(a, b, s)`), combined as `((s0+s4)+(s1+s5))+((s2+s6)+(s3+s7))`, then the tail in
/// order, fused as well.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let b = &b[..a.len()];
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: AVX2 and FMA were detected at run time.
        return unsafe { x86::dot(a, b) };
    }
    dot_portable(a, b)
}

/// `y[i] ← fma(alpha, x[i], y[i])` for `i < y.len()` (`x` may be longer).
#[inline]
pub fn axpy_f32(alpha: f32, x: &[f32], y: &mut [f32]) {
    let x = &x[..y.len()];
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: AVX2 and FMA were detected at run time.
        unsafe { x86::axpy(alpha, x, y) };
        return;
    }
    for (o, v) in y.iter_mut().zip(x) {
        *o = alpha.mul_add(*v, *o);
    }
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let split = a.len() - a.len() % 8;
    for (x, y) in a[..split].chunks_exact(8).zip(b[..split].chunks_exact(8)) {
        for i in 0..8 {
            acc[i] = x[i].mul_add(y[i], acc[i]);
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in a[split..].iter().zip(&b[split..]) {
        s = x.mul_add(*y, s);
    }
    s
}

/// Whether this CPU has AVX-512 F, DQ, BW and VL (detected once): the subsets the 512-bit
/// copies of plain f32 loops are compiled for, here and in the engine (`target_feature`
/// `avx512f,avx512dq,avx512bw,avx512vl,avx2`).
#[cfg(target_arch = "x86_64")]
pub fn avx512() -> bool {
    crate::Features::get().avx512()
}

/// Whether this CPU runs AVX2 and FMA (detected once; every AVX2 CPU but a few VIA ones has both).
#[cfg(target_arch = "x86_64")]
pub fn avx2_fma() -> bool {
    let f = crate::Features::get();
    f.avx2 && f.fma
}

/// Whether this CPU runs AVX2 (detected once).
#[cfg(target_arch = "x86_64")]
pub fn avx2() -> bool {
    crate::Features::get().avx2
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
        let split = a.len() - a.len() % 8;
        let mut acc = _mm256_setzero_ps();
        for (x, y) in a[..split].chunks_exact(8).zip(b[..split].chunks_exact(8)) {
            // SAFETY: both chunks hold exactly 8 f32; unaligned loads.
            let (xv, yv) = unsafe { (_mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(y.as_ptr())) };
            acc = _mm256_fmadd_ps(xv, yv, acc);
        }
        // [s0+s4, s1+s5, s2+s6, s3+s7], then ((s0+s4)+(s1+s5)) + ((s2+s6)+(s3+s7)), in registers.
        let h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
        let t = _mm_hadd_ps(h, h);
        let mut s = _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
        for (x, y) in a[split..].iter().zip(&b[split..]) {
            s = x.mul_add(*y, s);
        }
        s
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
        let split = y.len() - y.len() % 8;
        let av = _mm256_set1_ps(alpha);
        for (o, v) in y[..split].chunks_exact_mut(8).zip(x[..split].chunks_exact(8)) {
            // SAFETY: both chunks hold exactly 8 f32; unaligned loads and store.
            unsafe {
                let r = _mm256_fmadd_ps(av, _mm256_loadu_ps(v.as_ptr()), _mm256_loadu_ps(o.as_ptr()));
                _mm256_storeu_ps(o.as_mut_ptr(), r);
            }
        }
        for (o, v) in y[split..].iter_mut().zip(&x[split..]) {
            *o = alpha.mul_add(*v, *o);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Deterministic test values in [−0.5, 0.5).
    pub(crate) fn data(n: usize, seed: u32) -> Vec<f32> {
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
                *o = 0.37f32.mul_add(*v, *o);
            }
            assert_eq!(y, want, "axpy n={n}");
        }
    }

    #[test]
    fn dot_is_the_dot_product() {
        let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
        let b = [1.0f32; 9];
        assert_eq!(dot_f32(&a, &b), 45.0);
    }
}
