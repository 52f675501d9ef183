//! NEON inner loops of the matmul (aarch64; NEON is always present there). Integer formats compute
//! each block's integer dot product with widening multiplies and pairwise adds, then accumulate in
//! f32 exactly as the scalar path does, so results are bit-identical to scalar. Float formats use
//! 4-wide FMA and differ from scalar only by summation order.
//!
//! `sdot` (the dotprod extension) would halve the integer work, but its intrinsics are not stable
//! in Rust yet; `smull`/`smlal2`/`sadalp` is the stable equivalent.

use std::arch::aarch64::*;

use crate::activations::{ActKind, Activations};
use crate::blocks::{unpack_iq4_nl, unpack_q4_k, unpack_q5_0, unpack_q5_1, unpack_q5_k, unpack_q6_k};
use crate::format::WeightFormat;
use crate::fp16::{f16_at, f16_to_f32};

#[inline]
#[target_feature(enable = "neon")]
fn load_u8(b: &[u8]) -> uint8x16_t {
    assert!(b.len() >= 16);
    // SAFETY: the assertion guarantees 16 readable bytes; vld1q has no alignment requirement.
    unsafe { vld1q_u8(b.as_ptr()) }
}

#[inline]
#[target_feature(enable = "neon")]
fn load_i8(b: &[i8]) -> int8x16_t {
    assert!(b.len() >= 16);
    // SAFETY: as in `load_u8`.
    unsafe { vld1q_s8(b.as_ptr()) }
}

/// Four partial sums of 16 i8 × i8 products; exact (each i16 holds two products ≤ 128·127).
#[inline]
#[target_feature(enable = "neon")]
fn dot16(w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let p = vmull_s8(vget_low_s8(w), vget_low_s8(x));
    let p = vmlal_high_s8(p, w, x);
    vpaddlq_s16(p)
}

/// Σ w·x over 32 elements given as two 16-element halves.
#[inline]
#[target_feature(enable = "neon")]
fn dot32(w0: int8x16_t, w1: int8x16_t, x: &[i8]) -> i32 {
    vaddvq_s32(vaddq_s32(dot16(w0, load_i8(&x[0..16])), dot16(w1, load_i8(&x[16..32]))))
}

/// The 32 nibbles of a 16-byte block (low nibbles = elements 0..16, high = 16..32).
#[inline]
#[target_feature(enable = "neon")]
fn nibbles(qs: &[u8]) -> (int8x16_t, int8x16_t) {
    let v = load_u8(qs);
    let lo = vandq_u8(v, vdupq_n_u8(0x0F));
    let hi = vshrq_n_u8::<4>(v);
    (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
}

/// acc[l] += W_row · x[lane0 + l]; the NEON twin of `matmul::dot_row`.
#[target_feature(enable = "neon")]
pub(crate) fn dot_row(fmt: WeightFormat, row: &[u8], x: &Activations, lane0: usize, acc: &mut [f32]) {
    let cols = x.cols;
    let bb = fmt.block_bytes();
    match x.kind {
        ActKind::F32 | ActKind::F16 | ActKind::BF16 => float_row(fmt, row, x, lane0, acc),
        ActKind::Q8_0 => {
            let nb = cols / 32;
            let mut q = [0i8; 32];
            for (ib, b) in row.chunks_exact(bb).enumerate() {
                let (w0, w1, dw) = match fmt {
                    WeightFormat::Q8_0 => (
                        vreinterpretq_s8_u8(load_u8(&b[2..18])),
                        vreinterpretq_s8_u8(load_u8(&b[18..34])),
                        f16_at(b, 0),
                    ),
                    WeightFormat::Q4_0 => {
                        let (lo, hi) = nibbles(&b[2..18]);
                        let eight = vdupq_n_s8(8);
                        (vsubq_s8(lo, eight), vsubq_s8(hi, eight), f16_at(b, 0))
                    }
                    WeightFormat::IQ4_NL => {
                        let d = unpack_iq4_nl(b, &mut q);
                        (load_i8(&q[0..16]), load_i8(&q[16..32]), d)
                    }
                    WeightFormat::MXFP4 => {
                        let d = crate::blocks::unpack_mxfp4(b, &mut q);
                        (load_i8(&q[0..16]), load_i8(&q[16..32]), d)
                    }
                    _ => {
                        let d = unpack_q5_0(b, &mut q);
                        (load_i8(&q[0..16]), load_i8(&q[16..32]), d)
                    }
                };
                for (l, a) in acc.iter_mut().enumerate() {
                    let blk = (lane0 + l) * nb + ib;
                    let sumi = dot32(w0, w1, &x.q[32 * blk..32 * blk + 32]);
                    *a += sumi as f32 * (dw * x.d[blk]);
                }
            }
        }
        ActKind::Q8_1 => {
            let nb = cols / 32;
            let mut q = [0i8; 32];
            for (ib, b) in row.chunks_exact(bb).enumerate() {
                let (dw, mw) = (f16_at(b, 0), f16_at(b, 2));
                let (w0, w1) = if fmt == WeightFormat::Q5_1 {
                    unpack_q5_1(b, &mut q);
                    (load_i8(&q[0..16]), load_i8(&q[16..32]))
                } else {
                    nibbles(&b[4..20])
                };
                for (l, a) in acc.iter_mut().enumerate() {
                    let blk = (lane0 + l) * nb + ib;
                    let sumi = dot32(w0, w1, &x.q[32 * blk..32 * blk + 32]);
                    *a += (dw * x.d[blk]) * sumi as f32 + mw * x.s[blk];
                }
            }
        }
        ActKind::Q8K => {
            let nb = cols / 256;
            let mut q = [0i8; 256];
            if matches!(fmt, WeightFormat::Q4_K | WeightFormat::Q5_K) {
                let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
                for (ib, b) in row.chunks_exact(bb).enumerate() {
                    let (d, dmin) = if fmt == WeightFormat::Q5_K {
                        unpack_q5_k(b, &mut q, &mut sc, &mut mn)
                    } else {
                        unpack_q4_k(b, &mut q, &mut sc, &mut mn)
                    };
                    for (l, a) in acc.iter_mut().enumerate() {
                        let blk = (lane0 + l) * nb + ib;
                        let xq = &x.q[256 * blk..256 * blk + 256];
                        let bs = &x.bsums[16 * blk..16 * blk + 16];
                        let mut sumi = 0i32;
                        let mut summins = 0i32;
                        for j in 0..8 {
                            let w0 = load_i8(&q[32 * j..32 * j + 16]);
                            let w1 = load_i8(&q[32 * j + 16..32 * j + 32]);
                            sumi += i32::from(sc[j]) * dot32(w0, w1, &xq[32 * j..32 * j + 32]);
                            summins += i32::from(mn[j]) * (bs[2 * j] + bs[2 * j + 1]);
                        }
                        let dx = x.d[blk];
                        *a += d * dx * sumi as f32 - dmin * dx * summins as f32;
                    }
                }
            } else {
                let mut sc = [0i8; 16];
                for (ib, b) in row.chunks_exact(bb).enumerate() {
                    let d = unpack_q6_k(b, &mut q, &mut sc);
                    for (l, a) in acc.iter_mut().enumerate() {
                        let blk = (lane0 + l) * nb + ib;
                        let xq = &x.q[256 * blk..256 * blk + 256];
                        let mut sumi = 0i32;
                        for j in 0..16 {
                            let p = dot16(load_i8(&q[16 * j..16 * j + 16]), load_i8(&xq[16 * j..16 * j + 16]));
                            sumi += i32::from(sc[j]) * vaddvq_s32(p);
                        }
                        *a += d * x.d[blk] * sumi as f32;
                    }
                }
            }
        }
    }
}

/// Four weights of a float row as f32.
#[inline]
#[target_feature(enable = "neon")]
fn load_w4(fmt: WeightFormat, row: &[u8], k: usize) -> float32x4_t {
    match fmt {
        WeightFormat::F32 => vreinterpretq_f32_u8(load_u8(&row[4 * k..4 * k + 16])),
        WeightFormat::F16 => {
            // Half-precision vector types are not stable in Rust: convert through the scalar table.
            let v = [0, 1, 2, 3].map(|i| f16_to_f32(u16::from_le_bytes([row[2 * (k + i)], row[2 * (k + i) + 1]])));
            // SAFETY: `v` is 4 contiguous f32.
            unsafe { vld1q_f32(v.as_ptr()) }
        }
        _ => {
            let b = &row[2 * k..2 * k + 8];
            // SAFETY: `b` holds exactly 8 bytes = 4 u16; vld1 has no alignment requirement.
            let h = unsafe { vld1_u16(b.as_ptr().cast()) };
            vreinterpretq_f32_u32(vshlq_n_u32::<16>(vmovl_u16(h)))
        }
    }
}

#[inline]
fn scalar_w(fmt: WeightFormat, row: &[u8], k: usize) -> f32 {
    match fmt {
        WeightFormat::F32 => f32::from_le_bytes([row[4 * k], row[4 * k + 1], row[4 * k + 2], row[4 * k + 3]]),
        WeightFormat::F16 => f16_to_f32(u16::from_le_bytes([row[2 * k], row[2 * k + 1]])),
        _ => crate::fp16::bf16_to_f32(u16::from_le_bytes([row[2 * k], row[2 * k + 1]])),
    }
}

#[target_feature(enable = "neon")]
fn float_row(fmt: WeightFormat, row: &[u8], x: &Activations, lane0: usize, acc: &mut [f32]) {
    let cols = x.cols;
    let main = cols - cols % 4;
    for (l, a) in acc.iter_mut().enumerate() {
        let xs = &x.f[(lane0 + l) * cols..(lane0 + l + 1) * cols];
        let (mut s0, mut s1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let mut k = 0;
        while k + 8 <= main {
            // SAFETY: k + 8 <= cols, so both 4-float loads stay inside `xs`.
            let (x0, x1) = unsafe { (vld1q_f32(xs.as_ptr().add(k)), vld1q_f32(xs.as_ptr().add(k + 4))) };
            s0 = vfmaq_f32(s0, load_w4(fmt, row, k), x0);
            s1 = vfmaq_f32(s1, load_w4(fmt, row, k + 4), x1);
            k += 8;
        }
        if k < main {
            // SAFETY: k + 4 <= main <= cols.
            let x0 = unsafe { vld1q_f32(xs.as_ptr().add(k)) };
            s0 = vfmaq_f32(s0, load_w4(fmt, row, k), x0);
            k += 4;
        }
        let mut s = vaddvq_f32(vaddq_f32(s0, s1));
        for (kk, &xv) in xs.iter().enumerate().skip(k) {
            s += scalar_w(fmt, row, kk) * xv;
        }
        *a += s;
    }
}
