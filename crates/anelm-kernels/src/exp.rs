//! e^x for f32 in branch-free straight-line arithmetic the compiler vectorises, for the softmax
//! and SiLU loops of every decode step (the C library's `expf` is a call per element). Within a
//! few ulp of `f32::exp` over the normal range (tested). It saturates instead of leaving it:
//! below −87.33 it gives 2^−126 (the smallest normal f32, not 0) and above 88.37 about 2.4·10^38
//! (not ∞), which no softmax or SiLU can tell apart; NaN stays NaN.

/// ln 2 split so that `n · LN2_HI` is exact for every |n| ≤ 128.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Largest input whose result is finite (2^127 · e^0.35 < f32::MAX).
const MAX_INPUT: f32 = 88.37;
/// Smallest input whose result is normal (2^−126).
const MIN_INPUT: f32 = -87.33;
/// Adding 1.5 · 2^23 rounds to an integer held in the low mantissa bits of the sum.
const ROUND: f32 = 12_582_912.0;

/// e^x: x = n·ln 2 + r with |r| ≤ ln 2 / 2, e^r by its Taylor series to r^7 (the remainder is
/// below 2^−27 relative), scaled by 2^n through the exponent bits.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    // NaN stays NaN through `clamp`, and through `p` below.
    let xc = x.clamp(MIN_INPUT, MAX_INPUT);
    let t = xc * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    // The sum's bits are those of 1.5·2^23 plus n (two's complement in the low bits).
    let n_bits = t.to_bits().wrapping_sub(ROUND.to_bits());
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.0 / 5040.0;
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p * r + c;
    }
    p * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// SiLU of each gate times its up value: `g ← g / (1 + e^−g) · u` (SwiGLU's product).
///
/// The same arithmetic everywhere; where the CPU has AVX2 the loop is compiled for 256-bit
/// registers (eight values per instruction instead of SSE's four: this runs on every FFN row of
/// every lane of a decode step).
#[inline]
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::vector::avx512() {
        // SAFETY: AVX-512F/DQ/BW/VL were detected at run time.
        unsafe { silu_mul_avx512(g, u) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::vector::avx2() {
        // SAFETY: AVX2 was detected at run time.
        unsafe { silu_mul_avx2(g, u) };
        return;
    }
    silu_mul_loop(g, u);
}

#[inline(always)]
fn silu_mul_loop(g: &mut [f32], u: &[f32]) {
    for (g, &u) in g.iter_mut().zip(u) {
        *g = *g / (1.0 + exp_f32(-*g)) * u;
    }
}

/// [`silu_mul_loop`] compiled for AVX2 (no contraction into FMA: Rust never fuses a multiply
/// and an add on its own, so results equal the portable loop bit for bit).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn silu_mul_avx2(g: &mut [f32], u: &[f32]) {
    silu_mul_loop(g, u);
}

/// [`silu_mul_loop`] for 512-bit registers, sixteen values per instruction (the gate/up tasks
/// of every FFN run it on a whole tile); bit-equal for the same reason as the AVX2 copy.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2")]
fn silu_mul_avx512(g: &mut [f32], u: &[f32]) {
    silu_mul_loop(g, u);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_a_few_ulp_of_the_library_exp() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.3 {
            let (got, want) = (exp_f32(x), x.exp());
            let rel = ((f64::from(got) - f64::from(want)) / f64::from(want)).abs();
            worst = worst.max(rel);
            x += 0.000_731;
        }
        // 4 ulp of f32 at the top of a binade.
        assert!(worst < 4.0 * f64::from(f32::EPSILON), "worst relative error {worst:e}");
    }

    #[test]
    fn exp_edges_saturate() {
        assert_eq!(exp_f32(0.0), 1.0);
        for x in [-88.0, -1000.0, f32::NEG_INFINITY] {
            let y = exp_f32(x);
            assert!(y > 0.0 && y <= 1.2e-38, "e^{x} = {y}");
        }
        for x in [88.5, 1000.0, f32::INFINITY] {
            let y = exp_f32(x);
            assert!(y.is_finite() && y > 2e38, "e^{x} = {y}");
        }
        assert!(exp_f32(f32::NAN).is_nan());
    }

    #[test]
    fn silu_mul_equals_the_portable_loop_bit_for_bit() {
        let g0: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.37).sin() * 12.0).collect();
        let u: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.11).cos() * 3.0).collect();
        let (mut a, mut b) = (g0.clone(), g0);
        silu_mul(&mut a, &u);
        silu_mul_loop(&mut b, &u);
        assert_eq!(
            a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn silu_mul_matches_the_formula() {
        let mut g = [-9.0f32, -1.0, -0.0, 0.5, 3.0, 20.0, -100.0];
        let u = [2.0f32, -1.5, 1.0, 4.0, 0.25, 1.0, 1.0];
        let want: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| g / (1.0 + (-g).exp()) * u).collect();
        silu_mul(&mut g, &u);
        for (got, want) in g.iter().zip(&want) {
            assert!((got - want).abs() <= 1e-6 * want.abs().max(1e-30), "{got} vs {want}");
        }
    }
}
