//! Encoding f32 rows into each stored format. Used by tests (random blocks) and later by
//! weight conversion; simple round-to-nearest quantisers, not llama.cpp's search-based ones.

use crate::error::{KernelError, check_len};
use crate::format::WeightFormat;
use crate::fp16::{f32_to_bf16, f32_to_f16, round_f16};

fn signed_absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m })
}

/// Encode `src` (a whole number of blocks) into `dst` (exactly `row_bytes(src.len())` bytes).
pub fn quantize_row(fmt: WeightFormat, src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    check_len("encoded row", fmt.row_bytes(src.len())?, dst.len(), "bytes")?;
    let bb = fmt.block_bytes();
    match fmt {
        WeightFormat::F32 => {
            for (d, v) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        WeightFormat::F16 => {
            for (d, v) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f32_to_f16(*v).to_le_bytes());
            }
        }
        WeightFormat::BF16 => {
            for (d, v) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
            }
        }
        WeightFormat::Q8_0 => {
            for (b, x) in dst.chunks_exact_mut(bb).zip(src.chunks_exact(32)) {
                let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                for (o, v) in b[2..].iter_mut().zip(x) {
                    *o = ((v * id).round() as i32).clamp(-127, 127) as i8 as u8;
                }
            }
        }
        WeightFormat::Q4_0 => {
            for (b, x) in dst.chunks_exact_mut(bb).zip(src.chunks_exact(32)) {
                let d = signed_absmax(x) / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
                for j in 0..16 {
                    b[2 + j] = q(x[j]) | (q(x[j + 16]) << 4);
                }
            }
        }
        WeightFormat::IQ4_NL => {
            // The extreme value on the table's −127, every value to its nearest level.
            let levels = crate::blocks::IQ4_NL_VALUES;
            for (b, x) in dst.chunks_exact_mut(bb).zip(src.chunks_exact(32)) {
                let d = signed_absmax(x) / -127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                let q = |v: f32| {
                    let t = v * id;
                    (0u8..16)
                        .min_by(|&i, &j| {
                            let (a, c) = (f32::from(levels[usize::from(i)]), f32::from(levels[usize::from(j)]));
                            (a - t).abs().total_cmp(&(c - t).abs())
                        })
                        .unwrap_or(0)
                };
                for j in 0..16 {
                    b[2 + j] = q(x[j]) | (q(x[j + 16]) << 4);
                }
            }
        }
        WeightFormat::Q4_1 => {
            for (b, x) in dst.chunks_exact_mut(bb).zip(src.chunks_exact(32)) {
                let min = x.iter().copied().fold(f32::INFINITY, f32::min);
                let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                b[2..4].copy_from_slice(&f32_to_f16(min).to_le_bytes());
                let q = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                for j in 0..16 {
                    b[4 + j] = q(x[j]) | (q(x[j + 16]) << 4);
                }
            }
        }
        WeightFormat::Q5_0 => {
            for (b, x) in dst.chunks_exact_mut(bb).zip(src.chunks_exact(32)) {
                let d = signed_absmax(x) / -16.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                let q = |v: f32| ((v * id + 16.5) as i32).clamp(0, 31) as u32;
                let mut qh = 0u32;
                for j in 0..16 {
                    let (q0, q1) = (q(x[j]), q(x[j + 16]));
                    b[6 + j] = ((q0 & 0x0F) | ((q1 & 0x0F) << 4)) as u8;
                    qh |= ((q0 & 0x10) >> 4) << j;
                    qh |= ((q1 & 0x10) >> 4) << (j + 16);
                }
                b[2..6].copy_from_slice(&qh.to_le_bytes());
            }
        }
        WeightFormat::Q4_K => {
            for (b, x) in dst.chunks_exact_mut(bb).zip(src.chunks_exact(256)) {
                quantize_q4_k_block(x, b);
            }
        }
        WeightFormat::Q5_K => {
            for (b, x) in dst.chunks_exact_mut(bb).zip(src.chunks_exact(256)) {
                quantize_q5_k_block(x, b);
            }
        }
        WeightFormat::Q6_K => {
            for (b, x) in dst.chunks_exact_mut(bb).zip(src.chunks_exact(256)) {
                quantize_q6_k_block(x, b);
            }
        }
        WeightFormat::Q5_1 => {
            for (b, x) in dst.chunks_exact_mut(bb).zip(src.chunks_exact(32)) {
                quantize_q5_1_block(x, b);
            }
        }
        WeightFormat::Q2_K => {
            for (b, x) in dst.chunks_exact_mut(bb).zip(src.chunks_exact(256)) {
                quantize_q2_k_block(x, b);
            }
        }
        WeightFormat::Q3_K => {
            for (b, x) in dst.chunks_exact_mut(bb).zip(src.chunks_exact(256)) {
                quantize_q3_k_block(x, b);
            }
        }
        WeightFormat::IQ4_XS => {
            for (b, x) in dst.chunks_exact_mut(bb).zip(src.chunks_exact(256)) {
                quantize_iq4_xs_block(x, b);
            }
        }
        WeightFormat::MXFP4 => {
            for (b, x) in dst.chunks_exact_mut(bb).zip(src.chunks_exact(32)) {
                quantize_mxfp4_block(x, b);
            }
        }
    }
    Ok(())
}

/// MXFP4: the smallest power-of-two scale that puts the largest magnitude within the table's
/// ±12 (6 after the halving), every value to its nearest level.
fn quantize_mxfp4_block(x: &[f32], b: &mut [u8]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    // d = 2^(e − 128) with amax / d ≤ 12.
    let e = if amax > 0.0 && amax.is_finite() {
        ((amax / 12.0).log2().ceil() as i32 + 128).clamp(0, 254) as u8
    } else {
        0
    };
    let inv = inverse(crate::blocks::e8m0_half(e));
    b[0] = e;
    let level = |v: f32| {
        let t = v * inv;
        let levels = crate::blocks::MXFP4_VALUES;
        (0u8..16)
            .min_by(|&i, &j| {
                let (a, c) = (f32::from(levels[usize::from(i)]), f32::from(levels[usize::from(j)]));
                (a - t).abs().total_cmp(&(c - t).abs())
            })
            .unwrap_or(0)
    };
    for j in 0..16 {
        b[1 + j] = level(x[j]) | (level(x[j + 16]) << 4);
    }
}

/// `1 / d`, or 0 for a zero scale (a block of zeros).
fn inverse(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// Q5_1: scale (max − min) / 31 and the minimum as offset, values 0..=31.
fn quantize_q5_1_block(x: &[f32], b: &mut [u8]) {
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d = round_f16((max - min) / 31.0);
    let m = round_f16(min);
    let id = inverse(d);
    b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    b[2..4].copy_from_slice(&f32_to_f16(m).to_le_bytes());
    let q = |v: f32| ((v - m) * id).round().clamp(0.0, 31.0) as u32;
    let mut qh = 0u32;
    for j in 0..16 {
        let (q0, q1) = (q(x[j]), q(x[j + 16]));
        b[8 + j] = ((q0 & 0x0F) | ((q1 & 0x0F) << 4)) as u8;
        qh |= ((q0 & 0x10) >> 4) << j;
        qh |= ((q1 & 0x10) >> 4) << (j + 16);
    }
    b[4..8].copy_from_slice(&qh.to_le_bytes());
}

/// Q2_K: per 16 values a 4-bit scale of (max − min) / 3 and a 4-bit minimum (the values' floor,
/// at most 0), both multiples of the block's `d` and `dmin`; values 0..=3.
fn quantize_q2_k_block(x: &[f32], b: &mut [u8]) {
    let (mut scale, mut minv) = ([0f32; 16], [0f32; 16]);
    for j in 0..16 {
        let s = &x[16 * j..16 * j + 16];
        let lo = s.iter().copied().fold(0.0f32, f32::min);
        let hi = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        scale[j] = (hi - lo) / 3.0;
        minv[j] = -lo;
    }
    let d = round_f16(scale.iter().copied().fold(0.0, f32::max) / 15.0);
    let dmin = round_f16(minv.iter().copied().fold(0.0, f32::max) / 15.0);
    b[80..82].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    b[82..84].copy_from_slice(&f32_to_f16(dmin).to_le_bytes());
    b[16..80].fill(0);
    for j in 0..16 {
        let sc = (scale[j] * inverse(d)).round().clamp(0.0, 15.0) as u8;
        let mn = (minv[j] * inverse(dmin)).round().clamp(0.0, 15.0) as u8;
        b[j] = sc | (mn << 4);
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(mn));
        for l in 0..16 {
            let e = 16 * j + l;
            let q = ((x[e] + ml) * inverse(dl)).round().clamp(0.0, 3.0) as u8;
            let (n, jj, ll) = (e / 128, (e % 128) / 32, e % 32);
            b[16 + 32 * n + ll] |= q << (2 * jj);
        }
    }
}

/// Q3_K: per 16 values a signed 6-bit scale of |max| / 4 as a multiple of the block's `d`;
/// values −4..=3 (low two bits in `qs`, the third in `hmask`).
fn quantize_q3_k_block(x: &[f32], b: &mut [u8]) {
    let mut scale = [0f32; 16];
    for j in 0..16 {
        scale[j] = signed_absmax(&x[16 * j..16 * j + 16]) / -4.0;
    }
    let amax = signed_absmax(&scale);
    let d = round_f16(amax / -32.0);
    b[0..108].fill(0);
    b[108..110].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    for j in 0..16 {
        let sc = (scale[j] * inverse(d)).round().clamp(-32.0, 31.0) as i32;
        let stored = (sc + 32) as u8;
        if j < 8 {
            b[96 + j] |= stored & 0x0F;
        } else {
            b[96 + j - 8] |= (stored & 0x0F) << 4;
        }
        b[104 + j % 4] |= (stored >> 4) << (2 * (j / 4));
        let dl = d * sc as f32;
        for l in 0..16 {
            let e = 16 * j + l;
            let u = ((x[e] * inverse(dl)).round().clamp(-4.0, 3.0) as i32 + 4) as u8;
            let (n, jj, ll) = (e / 128, (e % 128) / 32, e % 32);
            b[32 + 32 * n + ll] |= (u & 3) << (2 * jj);
            b[ll] |= (u >> 2) << (4 * n + jj);
        }
    }
}

/// The index of the IQ4_NL level nearest `t`.
fn nearest_iq4_level(t: f32) -> u8 {
    let levels = crate::blocks::IQ4_NL_VALUES;
    (0u8..16)
        .min_by(|&i, &j| {
            let (a, c) = (f32::from(levels[usize::from(i)]), f32::from(levels[usize::from(j)]));
            (a - t).abs().total_cmp(&(c - t).abs())
        })
        .unwrap_or(0)
}

/// IQ4_XS: per 32 values a signed 6-bit scale putting the extreme value on the table's −127, as
/// a multiple of the block's `d`; every value to its nearest level.
fn quantize_iq4_xs_block(x: &[f32], b: &mut [u8]) {
    let mut scale = [0f32; 8];
    for j in 0..8 {
        scale[j] = signed_absmax(&x[32 * j..32 * j + 32]) / -127.0;
    }
    let d = round_f16(signed_absmax(&scale) / -32.0);
    b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    b[2..8].fill(0);
    let mut scales_h = 0u16;
    for j in 0..8 {
        let sc = (scale[j] * inverse(d)).round().clamp(-32.0, 31.0) as i32;
        let stored = (sc + 32) as u8;
        b[4 + j / 2] |= (stored & 0x0F) << (4 * (j % 2));
        scales_h |= u16::from(stored >> 4) << (2 * j);
        let id = inverse(d * sc as f32);
        for l in 0..16 {
            let (q0, q1) = (
                nearest_iq4_level(x[32 * j + l] * id),
                nearest_iq4_level(x[32 * j + 16 + l] * id),
            );
            b[8 + 16 * j + l] = q0 | (q1 << 4);
        }
    }
    b[2..4].copy_from_slice(&scales_h.to_le_bytes());
}

/// The shared part of Q4_K and Q5_K: per 32-value sub-block a scale and minimum as 6-bit
/// multiples of the super-block's `d` and `dmin`, and the values as `0 ..= top`. Writes `d`,
/// `dmin` and the 12 packed scale bytes (bytes 0..16 of both formats) and returns the values.
fn quantize_k_scales(x: &[f32], b: &mut [u8], top: f32) -> [u8; 256] {
    let mut scale = [0f32; 8];
    let mut minv = [0f32; 8];
    for j in 0..8 {
        let s = &x[32 * j..32 * j + 32];
        let lo = s.iter().copied().fold(0.0f32, f32::min);
        let hi = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        scale[j] = (hi - lo) / top;
        minv[j] = -lo;
    }
    let d = round_f16(scale.iter().copied().fold(0.0, f32::max) / 63.0);
    let dmin = round_f16(minv.iter().copied().fold(0.0, f32::max) / 63.0);
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        sc[j] = if d > 0.0 {
            (scale[j] / d).round().clamp(0.0, 63.0) as u8
        } else {
            0
        };
        mn[j] = if dmin > 0.0 {
            (minv[j] / dmin).round().clamp(0.0, 63.0) as u8
        } else {
            0
        };
    }
    b[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    b[2..4].copy_from_slice(&f32_to_f16(dmin).to_le_bytes());
    let s = &mut b[4..16];
    s.fill(0);
    for j in 0..8 {
        if j < 4 {
            s[j] = sc[j] & 63;
            s[j + 4] = mn[j] & 63;
        } else {
            s[j + 4] = (sc[j] & 0x0F) | ((mn[j] & 0x0F) << 4);
            s[j - 4] |= (sc[j] >> 4) << 6;
            s[j] |= (mn[j] >> 4) << 6;
        }
    }
    let mut q = [0u8; 256];
    for j in 0..8 {
        let ds = d * f32::from(sc[j]);
        let m = dmin * f32::from(mn[j]);
        for l in 0..32 {
            let v = x[32 * j + l];
            q[32 * j + l] = if ds > 0.0 {
                ((v + m) / ds).round().clamp(0.0, top) as u8
            } else {
                0
            };
        }
    }
    q
}

fn quantize_q4_k_block(x: &[f32], b: &mut [u8]) {
    let q = quantize_k_scales(x, b, 15.0);
    let qs = &mut b[16..144];
    for chunk in 0..4 {
        for l in 0..32 {
            qs[32 * chunk + l] = q[64 * chunk + l] | (q[64 * chunk + 32 + l] << 4);
        }
    }
}

fn quantize_q5_k_block(x: &[f32], b: &mut [u8]) {
    let q = quantize_k_scales(x, b, 31.0);
    let (qh, qs) = b[16..176].split_at_mut(32);
    qh.fill(0);
    for chunk in 0..4 {
        for l in 0..32 {
            let (lo, hi) = (q[64 * chunk + l], q[64 * chunk + 32 + l]);
            qs[32 * chunk + l] = (lo & 0x0F) | ((hi & 0x0F) << 4);
            qh[l] |= ((lo >> 4) << (2 * chunk)) | ((hi >> 4) << (2 * chunk + 1));
        }
    }
}

fn quantize_q6_k_block(x: &[f32], b: &mut [u8]) {
    let mut scale = [0f32; 16];
    for j in 0..16 {
        scale[j] = signed_absmax(&x[16 * j..16 * j + 16]) / -32.0;
    }
    let smax = signed_absmax(&scale);
    let d = round_f16(smax.abs() / 127.0);
    let mut sc = [0i8; 16];
    for j in 0..16 {
        sc[j] = if d > 0.0 {
            (scale[j] / d).round().clamp(-128.0, 127.0) as i8
        } else {
            0
        };
    }
    let mut q = [0u8; 256];
    for j in 0..16 {
        let ds = d * f32::from(sc[j]);
        for l in 0..16 {
            let v = x[16 * j + l];
            let qi = if ds != 0.0 {
                (v / ds).round().clamp(-32.0, 31.0) as i32
            } else {
                0
            };
            q[16 * j + l] = (qi + 32) as u8;
        }
    }
    let (ql, rest) = b.split_at_mut(128);
    let (qh, rest) = rest.split_at_mut(64);
    for half in 0..2 {
        let src = &q[128 * half..128 * half + 128];
        for l in 0..32 {
            let (q1, q2, q3, q4) = (src[l], src[l + 32], src[l + 64], src[l + 96]);
            ql[64 * half + l] = (q1 & 0x0F) | ((q3 & 0x0F) << 4);
            ql[64 * half + l + 32] = (q2 & 0x0F) | ((q4 & 0x0F) << 4);
            qh[32 * half + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    for (o, s) in rest[0..16].iter_mut().zip(sc) {
        *o = s as u8;
    }
    rest[16..18].copy_from_slice(&f32_to_f16(d).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dequantize_row;

    /// Every encoder round-trips random values within its format's resolution: the relative RMS
    /// error a format of that many bits gives (so a broken bit layout, which scrambles values,
    /// or an all-zero encoding fails).
    #[test]
    fn every_format_round_trips_within_its_resolution() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let values: Vec<f32> = (0..1024)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        let rms = |v: &[f32]| (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
        for fmt in WeightFormat::ALL {
            let bound = match fmt {
                WeightFormat::F32 => 0.0,
                WeightFormat::F16 | WeightFormat::BF16 => 0.01,
                WeightFormat::Q8_0 => 0.01,
                WeightFormat::Q6_K => 0.03,
                WeightFormat::Q5_0 | WeightFormat::Q5_1 | WeightFormat::Q5_K => 0.06,
                WeightFormat::Q4_0 | WeightFormat::Q4_1 | WeightFormat::Q4_K => 0.12,
                WeightFormat::IQ4_NL | WeightFormat::IQ4_XS => 0.12,
                // Eight magnitudes under a power-of-two scale.
                WeightFormat::MXFP4 => 0.2,
                WeightFormat::Q3_K => 0.25,
                WeightFormat::Q2_K => 0.45,
            };
            let mut bytes = vec![0u8; fmt.row_bytes(values.len()).unwrap()];
            quantize_row(fmt, &values, &mut bytes).unwrap();
            let mut back = vec![0f32; values.len()];
            dequantize_row(fmt, &bytes, &mut back).unwrap();
            let err: Vec<f32> = back.iter().zip(&values).map(|(b, v)| b - v).collect();
            let rel = rms(&err) / rms(&values);
            assert!(rel <= bound, "{fmt}: relative RMS error {rel} over {bound}");
            assert!(rms(&back) > 0.5 * rms(&values), "{fmt}: the values did not survive");
        }
    }
}
