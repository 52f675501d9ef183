//! Decoding stored rows to f32.

use crate::blocks::*;
use crate::error::{KernelError, check_len};
use crate::format::WeightFormat;
use crate::fp16::{bf16_to_f32, f16_to_f32};

/// Decode one row (dst.len() elements) from its stored bytes (src.len() must equal row_bytes(dst.len())).
pub fn dequantize_row(fmt: WeightFormat, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    check_len("stored row", fmt.row_bytes(dst.len())?, src.len(), "bytes")?;
    let bb = fmt.block_bytes();
    match fmt {
        WeightFormat::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        WeightFormat::F16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        WeightFormat::BF16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q5_0 | WeightFormat::IQ4_NL | WeightFormat::MXFP4 => {
            let mut q = [0i8; 32];
            for (out, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(bb)) {
                let d = match fmt {
                    WeightFormat::Q8_0 => unpack_q8_0(b, &mut q),
                    WeightFormat::Q4_0 => unpack_q4_0(b, &mut q),
                    WeightFormat::IQ4_NL => unpack_iq4_nl(b, &mut q),
                    WeightFormat::MXFP4 => unpack_mxfp4(b, &mut q),
                    _ => unpack_q5_0(b, &mut q),
                };
                for (o, &v) in out.iter_mut().zip(&q) {
                    *o = f32::from(v) * d;
                }
            }
        }
        WeightFormat::Q4_1 | WeightFormat::Q5_1 => {
            let mut q = [0i8; 32];
            for (out, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(bb)) {
                let (d, m) = if fmt == WeightFormat::Q5_1 {
                    unpack_q5_1(b, &mut q)
                } else {
                    unpack_q4_1(b, &mut q)
                };
                for (o, &v) in out.iter_mut().zip(&q) {
                    *o = f32::from(v) * d + m;
                }
            }
        }
        WeightFormat::Q4_K | WeightFormat::Q5_K => {
            let (mut q, mut sc, mut mn) = ([0i8; 256], [0u8; 8], [0u8; 8]);
            for (out, b) in dst.chunks_exact_mut(256).zip(src.chunks_exact(bb)) {
                let (d, dmin) = if fmt == WeightFormat::Q5_K {
                    unpack_q5_k(b, &mut q, &mut sc, &mut mn)
                } else {
                    unpack_q4_k(b, &mut q, &mut sc, &mut mn)
                };
                for j in 0..8 {
                    let (d1, m1) = (d * f32::from(sc[j]), dmin * f32::from(mn[j]));
                    for l in 0..32 {
                        out[32 * j + l] = d1 * f32::from(q[32 * j + l]) - m1;
                    }
                }
            }
        }
        WeightFormat::Q6_K => {
            let (mut q, mut sc) = ([0i8; 256], [0i8; 16]);
            for (out, b) in dst.chunks_exact_mut(256).zip(src.chunks_exact(bb)) {
                let d = unpack_q6_k(b, &mut q, &mut sc);
                for j in 0..16 {
                    let ds = d * f32::from(sc[j]);
                    for l in 0..16 {
                        out[16 * j + l] = ds * f32::from(q[16 * j + l]);
                    }
                }
            }
        }
        WeightFormat::Q2_K => {
            let (mut q, mut sc) = ([0i8; 256], [0u8; 16]);
            for (out, b) in dst.chunks_exact_mut(256).zip(src.chunks_exact(bb)) {
                let (d, dmin) = unpack_q2_k(b, &mut q, &mut sc);
                for j in 0..16 {
                    let (dl, ml) = (d * f32::from(sc[j] & 0x0F), dmin * f32::from(sc[j] >> 4));
                    for l in 0..16 {
                        out[16 * j + l] = dl * f32::from(q[16 * j + l]) - ml;
                    }
                }
            }
        }
        WeightFormat::Q3_K => {
            let (mut q, mut sc) = ([0i8; 256], [0i8; 16]);
            for (out, b) in dst.chunks_exact_mut(256).zip(src.chunks_exact(bb)) {
                let d = unpack_q3_k(b, &mut q, &mut sc);
                for j in 0..16 {
                    let dl = d * f32::from(sc[j]);
                    for l in 0..16 {
                        out[16 * j + l] = dl * f32::from(q[16 * j + l]);
                    }
                }
            }
        }
        WeightFormat::IQ4_XS => {
            let (mut q, mut sc) = ([0i8; 256], [0i8; 8]);
            for (out, b) in dst.chunks_exact_mut(256).zip(src.chunks_exact(bb)) {
                let d = unpack_iq4_xs(b, &mut q, &mut sc);
                for j in 0..8 {
                    let dl = d * f32::from(sc[j]);
                    for l in 0..32 {
                        out[32 * j + l] = dl * f32::from(q[32 * j + l]);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Reference dot: dequantise the row and sum W·x in f64 (for tests and debugging, slow).
pub fn dot_reference(fmt: WeightFormat, row: &[u8], x: &[f32]) -> Result<f64, KernelError> {
    let mut w = vec![0.0f32; x.len()];
    dequantize_row(fmt, row, &mut w)?;
    Ok(w.iter().zip(x).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum())
}
