//! Half-precision helpers: f16/bf16 decode through a table (as ggml does) and RNE rounding.

use std::sync::OnceLock;

use half::{bf16, f16};

fn table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()).collect())
}

/// f16 bits → f32.
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    table()[bits as usize]
}

/// f16 stored little-endian at `b[0..2]` → f32.
#[inline]
pub fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// bf16 bits → f32.
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// f32 → f16 bits, round to nearest even.
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// `dst[i] = f32_to_f16(src[i])` for a whole row (KV-cache writes): F16C eight at a time where
/// the CPU has it, the same bits as the scalar conversion (tested, NaN excepted: any NaN stays
/// a NaN).
pub fn f32_to_f16_slice(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_f16_slice: lengths differ");
    let done = f32_to_f16_simd(src, dst);
    for (d, &x) in dst[done..].iter_mut().zip(&src[done..]) {
        *d = f32_to_f16(x);
    }
}

/// The vector part of [`f32_to_f16_slice`]: how many leading values it converted.
fn f32_to_f16_simd(src: &[f32], dst: &mut [u16]) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::Features::get().f16c {
            // SAFETY: AVX and F16C were detected just above.
            unsafe { f32_to_f16_f16c(src, dst) };
            return src.len() / 8 * 8;
        }
    }
    let _ = (src, dst);
    0
}

/// The whole groups of eight of [`f32_to_f16_slice`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
fn f32_to_f16_f16c(src: &[f32], dst: &mut [u16]) {
    use std::arch::x86_64::*;
    for (s, d) in src.chunks_exact(8).zip(dst.chunks_exact_mut(8)) {
        // SAFETY: `s` and `d` are 8 elements (chunks_exact); unaligned load and store.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
            _mm_storeu_si128(d.as_mut_ptr().cast(), h);
        }
    }
}

/// `v[i] = round_f16(v[i])` for a whole row (attention's probabilities and queries, many of
/// them below f16's normal range, where the scalar rounding takes the full conversion): F16C
/// there and back eight at a time where the CPU has it, the same values as the scalar rounding
/// (tested, NaN excepted: any NaN stays a NaN).
pub fn round_f16_slice(v: &mut [f32]) {
    let done = round_f16_simd(v);
    for x in &mut v[done..] {
        *x = round_f16(*x);
    }
}

/// The vector part of [`round_f16_slice`]: how many leading values it rounded.
fn round_f16_simd(v: &mut [f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::Features::get().f16c {
            // SAFETY: AVX and F16C were detected just above.
            unsafe { round_f16_f16c(v) };
            return v.len() / 8 * 8;
        }
    }
    let _ = v;
    0
}

/// The whole groups of eight of [`round_f16_slice`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
fn round_f16_f16c(v: &mut [f32]) {
    use std::arch::x86_64::*;
    for c in v.chunks_exact_mut(8) {
        // SAFETY: `c` is 8 f32 (chunks_exact); unaligned load and store.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(c.as_ptr()));
            _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
}

/// f32 → bf16 bits, round to nearest even.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

/// f32 → f16 → f32 with round-to-nearest-even (KV-cache rounding, ANE surfaces, tests).
///
/// Values in f16's normal range are rounded in place on the f32 bits (drop 13 mantissa bits,
/// nearest even); subnormals, overflow, infinities and NaN take the full conversion. Same result
/// either way (tested against `half` over a dense sample of every f32 bit pattern).
#[inline]
pub fn round_f16(x: f32) -> f32 {
    let b = x.to_bits();
    // 2^-14 (smallest normal f16) ≤ |x| < 65520 (the first value that rounds to infinity).
    if ((b & 0x7FFF_FFFF).wrapping_sub(0x3880_0000)) < 0x477F_F000 - 0x3880_0000 {
        f32::from_bits(b.wrapping_add(0x0FFF + ((b >> 13) & 1)) & !0x1FFF)
    } else {
        f16_to_f32(f32_to_f16(x))
    }
}

/// f32 → bf16 → f32 with round-to-nearest-even.
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    bf16_to_f32(f32_to_bf16(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_conversion_equals_the_scalar_one() {
        // Every 61st f32 bit pattern (normals, subnormals, overflow, infinities, NaN), in rows
        // with a tail shorter than eight.
        let src: Vec<f32> = (0..=u32::MAX).step_by(61).map(f32::from_bits).take(1_000_003).collect();
        let mut got = vec![0u16; src.len()];
        f32_to_f16_slice(&src, &mut got);
        for (x, g) in src.iter().zip(&got) {
            let want = f32_to_f16(*x);
            if x.is_nan() {
                assert!(f16::from_bits(*g).is_nan(), "{x} -> {g:#x}");
            } else {
                assert_eq!(*g, want, "{x:e} ({:#x})", x.to_bits());
            }
        }
        let edges = [
            65504.0f32,
            65519.99,
            65520.0,
            -65520.0,
            6.1035156e-5,
            5.96e-8,
            2.9e-8,
            -0.0,
            0.0,
        ];
        let mut out = [0u16; 9];
        f32_to_f16_slice(&edges, &mut out);
        assert_eq!(out.to_vec(), edges.iter().map(|&x| f32_to_f16(x)).collect::<Vec<_>>());
    }

    #[test]
    fn slice_rounding_equals_the_scalar_one() {
        let mut got: Vec<f32> = (0..=u32::MAX).step_by(59).map(f32::from_bits).take(1_000_003).collect();
        let src = got.clone();
        round_f16_slice(&mut got);
        for (x, g) in src.iter().zip(&got) {
            if x.is_nan() {
                assert!(g.is_nan(), "{x} -> {g}");
            } else {
                assert_eq!(g.to_bits(), round_f16(*x).to_bits(), "{x:e} ({:#x})", x.to_bits());
            }
        }
    }

    #[test]
    fn fast_round_f16_equals_the_full_conversion() {
        let full = |x: f32| f16::from_f32(x).to_f32();
        let same = |b: u32| {
            let x = f32::from_bits(b);
            let (a, e) = (round_f16(x), full(x));
            assert!(
                a.to_bits() == e.to_bits() || (a.is_nan() && e.is_nan()),
                "{b:#010x}: {a} vs {e}"
            );
        };
        // A dense stride over every bit pattern, plus every pattern near the range edges and ties.
        for b in (0..=u32::MAX).step_by(97) {
            same(b);
        }
        for edge in [0x3880_0000u32, 0x477F_E000, 0x477F_F000, 0x7F80_0000] {
            for sign in [0, 0x8000_0000] {
                for d in 0..0x4000u32 {
                    same(sign | (edge.wrapping_sub(0x2000) + d));
                }
            }
        }
    }

    #[test]
    fn rounding_is_nearest_even() {
        // 1 + 2^-11 is exactly halfway between 1 and the next f16 (1 + 2^-10): ties to even → 1.
        assert_eq!(round_f16(1.0 + 2f32.powi(-11)), 1.0);
        // 1 + 3·2^-11 is halfway between 1+2^-10 and 1+2^-9: ties to even → 1 + 2^-9.
        assert_eq!(round_f16(1.0 + 3.0 * 2f32.powi(-11)), 1.0 + 2f32.powi(-9));
        assert_eq!(round_f16(65504.0), 65504.0);
        assert!(round_f16(1e6).is_infinite());
        assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 1.0);
        for b in [0u16, 0x3c00, 0x8001, 0x7bff, 0xfc00] {
            assert_eq!(f32_to_f16(f16_to_f32(b)), b);
        }
    }
}
