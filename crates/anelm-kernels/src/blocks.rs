//! Block layouts as llama.cpp defines them, unpacked to small integers plus scales so that
//! dequantisation and the integer dot products share one decoder per format.
//! Every function takes exactly one block's bytes (callers slice by `block_bytes`).

use crate::fp16::f16_at;

/// Q8_0: { f16 d; i8 qs[32] } → (d, q).
#[inline]
pub fn unpack_q8_0(b: &[u8], q: &mut [i8; 32]) -> f32 {
    for (dst, &src) in q.iter_mut().zip(&b[2..34]) {
        *dst = src as i8;
    }
    f16_at(b, 0)
}

/// Q4_0: { f16 d; u8 qs[16] } (low nibbles → 0..16, high → 16..32), value (q − 8)·d.
#[inline]
pub fn unpack_q4_0(b: &[u8], q: &mut [i8; 32]) -> f32 {
    let qs = &b[2..18];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0F) as i8 - 8;
        q[j + 16] = (qs[j] >> 4) as i8 - 8;
    }
    f16_at(b, 0)
}

/// IQ4_NL's values: ggml's `kvalues_iq4nl`, the 16 levels a 4-bit index selects.
pub const IQ4_NL_VALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// IQ4_NL: { f16 d; u8 qs[16] } (low nibbles → elements 0..16, high → 16..32), each an index
/// into [`IQ4_NL_VALUES`]; value `IQ4_NL_VALUES[i]·d`.
#[inline]
pub fn unpack_iq4_nl(b: &[u8], q: &mut [i8; 32]) -> f32 {
    let qs = &b[2..18];
    for j in 0..16 {
        q[j] = IQ4_NL_VALUES[usize::from(qs[j] & 0x0F)];
        q[j + 16] = IQ4_NL_VALUES[usize::from(qs[j] >> 4)];
    }
    f16_at(b, 0)
}

/// MXFP4's values: ggml's `kvalues_mxfp4`, the FP4 (E2M1) numbers 0, ±0.5, ±1, ±1.5, ±2, ±3, ±4,
/// ±6 doubled into integers (the scale is halved to match).
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half of the E8M0 scale `e`: 2^(e − 127) / 2 = 2^(e − 128), exactly (ggml's
/// `GGML_E8M0_TO_FP32_HALF`; `e` 0 and 1 give subnormal floats).
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (u32::from(e) - 1) << 23
    };
    f32::from_bits(bits)
}

/// MXFP4: { u8 e; u8 qs[16] } (low nibbles → elements 0..16, high → 16..32), each an index into
/// [`MXFP4_VALUES`]; value `MXFP4_VALUES[i] · e8m0_half(e)`.
#[inline]
pub fn unpack_mxfp4(b: &[u8], q: &mut [i8; 32]) -> f32 {
    let qs = &b[1..17];
    for j in 0..16 {
        q[j] = MXFP4_VALUES[usize::from(qs[j] & 0x0F)];
        q[j + 16] = MXFP4_VALUES[usize::from(qs[j] >> 4)];
    }
    e8m0_half(b[0])
}

/// Q4_1: { f16 d; f16 m; u8 qs[16] }, value q·d + m, q in 0..16 → (d, m).
#[inline]
pub fn unpack_q4_1(b: &[u8], q: &mut [i8; 32]) -> (f32, f32) {
    let qs = &b[4..20];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0F) as i8;
        q[j + 16] = (qs[j] >> 4) as i8;
    }
    (f16_at(b, 0), f16_at(b, 2))
}

/// Q5_0: { f16 d; u8 qh[4]; u8 qs[16] }, fifth bit from qh, value (q − 16)·d.
#[inline]
pub fn unpack_q5_0(b: &[u8], q: &mut [i8; 32]) -> f32 {
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        q[j] = (((qs[j] & 0x0F) as u32 | h0) as i32 - 16) as i8;
        q[j + 16] = (((qs[j] >> 4) as u32 | h1) as i32 - 16) as i8;
    }
    f16_at(b, 0)
}

/// The 6-bit scale and minimum of sub-block `j` of a Q4_K block (ggml's get_scale_min_k4).
#[inline]
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K: { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] } → q in 0..16, 8 sub-block scales and
/// minimums; value = d·sc[j]·q − dmin·m[j] for element in sub-block j (32 elements each).
#[inline]
pub fn unpack_q4_k(b: &[u8], q: &mut [i8; 256], sc: &mut [u8; 8], mn: &mut [u8; 8]) -> (f32, f32) {
    let scales = &b[4..16];
    let qs = &b[16..144];
    for chunk in 0..4 {
        let (s0, m0) = scale_min_k4(2 * chunk, scales);
        let (s1, m1) = scale_min_k4(2 * chunk + 1, scales);
        sc[2 * chunk] = s0;
        mn[2 * chunk] = m0;
        sc[2 * chunk + 1] = s1;
        mn[2 * chunk + 1] = m1;
        let src = &qs[32 * chunk..32 * chunk + 32];
        for l in 0..32 {
            q[64 * chunk + l] = (src[l] & 0x0F) as i8;
            q[64 * chunk + 32 + l] = (src[l] >> 4) as i8;
        }
    }
    (f16_at(b, 0), f16_at(b, 2))
}

/// Q5_K: { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] } → q in 0..32, 8 sub-block
/// scales and minimums as Q4_K's; the low 4 bits of each value as Q4_K's nibbles, the fifth is
/// bit `2c` (elements `64c + l`) or `2c + 1` (elements `64c + 32 + l`) of `qh[l]`.
#[inline]
pub fn unpack_q5_k(b: &[u8], q: &mut [i8; 256], sc: &mut [u8; 8], mn: &mut [u8; 8]) -> (f32, f32) {
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for chunk in 0..4 {
        for half in 0..2 {
            (sc[2 * chunk + half], mn[2 * chunk + half]) = scale_min_k4(2 * chunk + half, scales);
        }
        let src = &qs[32 * chunk..32 * chunk + 32];
        for l in 0..32 {
            let h0 = ((qh[l] >> (2 * chunk)) & 1) << 4;
            let h1 = ((qh[l] >> (2 * chunk + 1)) & 1) << 4;
            q[64 * chunk + l] = ((src[l] & 0x0F) | h0) as i8;
            q[64 * chunk + 32 + l] = ((src[l] >> 4) | h1) as i8;
        }
    }
    (f16_at(b, 0), f16_at(b, 2))
}

/// Q6_K: { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d } → q in −32..32 and 16 sub-block scales;
/// value = d·sc[j]·q for element in sub-block j (16 elements each).
#[inline]
pub fn unpack_q6_k(b: &[u8], q: &mut [i8; 256], sc: &mut [i8; 16]) -> f32 {
    let ql = &b[0..128];
    let qh = &b[128..192];
    for (dst, &src) in sc.iter_mut().zip(&b[192..208]) {
        *dst = src as i8;
    }
    for half in 0..2 {
        let ql = &ql[64 * half..64 * half + 64];
        let qh = &qh[32 * half..32 * half + 32];
        let out = &mut q[128 * half..128 * half + 128];
        for l in 0..32 {
            out[l] = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i8 - 32;
            out[l + 32] = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            out[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            out[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    f16_at(b, 208)
}

/// Q5_1: { f16 d; f16 m; u8 qh[4]; u8 qs[16] }, fifth bit from qh as Q5_0's, value q·d + m,
/// q in 0..32 → (d, m).
#[inline]
pub fn unpack_q5_1(b: &[u8], q: &mut [i8; 32]) -> (f32, f32) {
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        q[j] = ((qs[j] & 0x0F) as u32 | h0) as i8;
        q[j + 16] = ((qs[j] >> 4) as u32 | h1) as i8;
    }
    (f16_at(b, 0), f16_at(b, 2))
}

/// Q2_K: { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin } → q in 0..4 and each 16-element
/// sub-block's scale byte (low nibble the scale, high nibble the minimum); value
/// d·(sc & 15)·q − dmin·(sc >> 4). Element `128n + 32j + l` is bits `2j..2j+2` of `qs[32n + l]`.
#[inline]
pub fn unpack_q2_k(b: &[u8], q: &mut [i8; 256], sc: &mut [u8; 16]) -> (f32, f32) {
    sc.copy_from_slice(&b[0..16]);
    let qs = &b[16..80];
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                q[128 * n + 32 * j + l] = ((qs[32 * n + l] >> (2 * j)) & 3) as i8;
            }
        }
    }
    (f16_at(b, 80), f16_at(b, 82))
}

/// Q3_K: { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d } → q in −4..4 and 16 signed 6-bit
/// sub-block scales; value d·sc[j]·q. Element `128n + 32j + l` takes its low two bits from bits
/// `2j..2j+2` of `qs[32n + l]` and subtracts 4 unless bit `4n + j` of `hmask[l]` is set; scale `i`
/// has its low nibble in `scales[i % 8]` (low half for i < 8, high half after) and its top two
/// bits at bit `2·(i / 4)` of `scales[8 + i % 4]`, stored with an offset of 32.
#[inline]
pub fn unpack_q3_k(b: &[u8], q: &mut [i8; 256], sc: &mut [i8; 16]) -> f32 {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    *sc = q3_k_scales(b);
    for n in 0..2 {
        for j in 0..4 {
            let bit = 1u8 << (4 * n + j);
            for l in 0..32 {
                let low = ((qs[32 * n + l] >> (2 * j)) & 3) as i8;
                q[128 * n + 32 * j + l] = if hmask[l] & bit != 0 { low } else { low - 4 };
            }
        }
    }
    f16_at(b, 108)
}

/// The 16 signed sub-block scales of a Q3_K block (`−32 ..= 31`): scale `i`'s low four bits
/// are nibble `i / 8` of `scales[i % 8]`, its high two bits `2(i / 4) ..` of `scales[8 + i % 4]`.
#[inline]
pub(crate) fn q3_k_scales(b: &[u8]) -> [i8; 16] {
    let scales = &b[96..108];
    std::array::from_fn(|i| {
        let low = if i < 8 { scales[i] & 0x0F } else { scales[i - 8] >> 4 };
        let high = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

/// The 8 signed sub-block scales of an IQ4_XS block (`−32 ..= 31`, see [`unpack_iq4_xs`]).
#[inline]
pub(crate) fn iq4_xs_scales(b: &[u8]) -> [i8; 8] {
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    std::array::from_fn(|j| {
        let low = (b[4 + j / 2] >> (4 * (j % 2))) & 0x0F;
        let high = ((scales_h >> (2 * j)) & 3) as u8;
        (low | (high << 4)) as i8 - 32
    })
}

/// IQ4_XS: { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] } → the [`IQ4_NL_VALUES`] of each
/// 4-bit index and 8 signed 6-bit scales of 32 elements each; value d·sc[j]·q. Sub-block `j`'s
/// scale is nibble `j % 2` of `scales_l[j / 2]` with bits `2j..2j+2` of `scales_h` on top, offset
/// 32; its indices are `qs[16j..16j+16]`, low nibbles first as IQ4_NL's.
#[inline]
pub fn unpack_iq4_xs(b: &[u8], q: &mut [i8; 256], sc: &mut [i8; 8]) -> f32 {
    let qs = &b[8..136];
    *sc = iq4_xs_scales(b);
    for j in 0..8 {
        let src = &qs[16 * j..16 * j + 16];
        for l in 0..16 {
            q[32 * j + l] = IQ4_NL_VALUES[usize::from(src[l] & 0x0F)];
            q[32 * j + 16 + l] = IQ4_NL_VALUES[usize::from(src[l] >> 4)];
        }
    }
    f16_at(b, 0)
}
