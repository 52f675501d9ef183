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

/// f32 → bf16 bits, round to nearest even.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

/// f32 → f16 → f32 with round-to-nearest-even (KV-cache rounding, ANE surfaces, tests).
#[inline]
pub fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
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
