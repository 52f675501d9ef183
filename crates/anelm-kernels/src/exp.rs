//! e^x for f32 in straight-line arithmetic the compiler vectorises, for the softmax and SiLU
//! loops of every decode step (the C library's `expf` is a call per element). Within a few
//! ulp of `f32::exp` over the normal range (tested); flushes to 0 below e^−87.33, and is ∞ above
//! e^88.37 and NaN for NaN.

/// ln 2 split so that `n · LN2_HI` is exact for every |n| ≤ 128.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Largest input whose result is finite (2^127 · e^0.35 < f32::MAX).
const MAX_INPUT: f32 = 88.37;
/// Smallest input whose result is normal (2^−126).
const MIN_INPUT: f32 = -87.33;
/// Adding then subtracting 1.5 · 2^23 rounds to the nearest integer.
const ROUND: f32 = 12_582_912.0;

/// e^x: x = n·ln 2 + r with |r| ≤ ln 2 / 2, e^r by its Taylor series to r^7 (the remainder is
/// below 2^−27 relative), scaled by 2^n through the exponent bits.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    // NaN stays NaN through `clamp`.
    let xc = x.clamp(MIN_INPUT, MAX_INPUT);
    let n = (xc * std::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.0 / 5040.0;
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p * r + c;
    }
    // NaN casts to 0, and stays NaN through `p`.
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    let y = p * scale;
    if x < MIN_INPUT {
        0.0
    } else if x > MAX_INPUT {
        f32::INFINITY
    } else {
        y
    }
}

/// SiLU of each gate times its up value: `g ← g / (1 + e^−g) · u` (SwiGLU's product).
#[inline]
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    for (g, &u) in g.iter_mut().zip(u) {
        *g = *g / (1.0 + exp_f32(-*g)) * u;
    }
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
    fn exp_edges() {
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-1000.0), 0.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(1000.0), f32::INFINITY);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert!(exp_f32(88.3).is_finite() && exp_f32(-87.3) > 0.0);
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
