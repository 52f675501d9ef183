//! The integer core of the aarch64 packed kernels (`packed_neon*.rs`): the dot products of one
//! 8-row group against 16 activation bytes, in the layout of `packed_layout.rs`, where one
//! 32-byte vector holds the same four columns of each of the 8 rows (two 16-byte NEON registers:
//! rows 0–3 and rows 4–7).
//!
//! Two engines give the same exact integers: `sdot` by element (dotprod: four products per row
//! and 32-bit lane in one instruction, the activation's 4-byte group picked by index from one
//! register), and `smull` (widening multiplies and pairwise adds) for cores without dotprod.
//! `sdot`'s intrinsics are not stable in Rust 1.95 (`stdarch_neon_dotprod`), so it is written as
//! inline assembly, in a function compiled for dotprod; for it to inline, every kernel that
//! calls it is compiled for dotprod too (`packed_neon`'s two instantiations).

use std::arch::aarch64::*;
use std::arch::asm;

/// Four column groups of the 8 rows: `w[k][0]` rows 0–3, `w[k][1]` rows 4–7, each row's 4
/// bytes of group `k` side by side (signed weights).
pub(crate) type Quad = [[int8x16_t; 2]; 4];

/// Running sums of one 8-row group. `sdot` keeps rows 0–3 in `[0]` and rows 4–7 in `[1]`;
/// `smull` keeps rows (0, 1), (2, 3), (4, 5), (6, 7), each row's sums in two 32-bit lanes.
pub(crate) type DotAcc = [int32x4_t; 4];

/// Zero sums.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn dot_zero() -> DotAcc {
    [vdupq_n_s32(0); 4]
}

/// The 8 row sums of `sdot_quad`'s accumulator: rows 0–3, rows 4–7.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn sdot_finish(acc: DotAcc) -> [int32x4_t; 2] {
    [acc[0], acc[1]]
}

/// The 8 row sums of `smull_quad`'s accumulator: rows 0–3, rows 4–7.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn smull_finish(acc: DotAcc) -> [int32x4_t; 2] {
    [vpaddq_s32(acc[0], acc[1]), vpaddq_s32(acc[2], acc[3])]
}

/// `acc[i] += Σ_j w[4i + j] · x[4L + j]`, one `sdot` by element.
macro_rules! sdot_lane {
    ($acc:expr, $w:expr, $x:expr, $lane:literal) => {{
        let mut acc: int32x4_t = $acc;
        // SAFETY: SIMD only: registers in, register out, no memory or flags touched. It expands
        // only in `sdot_quad`, compiled for dotprod; its callers (the `packed_neon::sdot`
        // kernels) run only where `Features::dotprod` holds.
        unsafe {
            asm!(
                concat!("sdot {acc:v}.4s, {w:v}.16b, {x:v}.4b[", $lane, "]"),
                acc = inout(vreg) acc,
                w = in(vreg) $w,
                x = in(vreg) $x,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        acc
    }};
}

/// `acc` plus, for each of the 8 rows, Σ over `k < 4`, `i < 4` of `w[k][row] byte i · x byte
/// 4k + i` (16 columns whose activations are the 16 bytes of `x`), with `sdot` by element
/// (ARMv8.2 dotprod): each instruction adds four products to each of four rows, the activation
/// group picked by index from `x`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
pub(crate) fn sdot_quad(acc: DotAcc, w: &Quad, x: int8x16_t) -> DotAcc {
    let [mut a, mut b, c, d] = acc;
    a = sdot_lane!(a, w[0][0], x, "0");
    b = sdot_lane!(b, w[0][1], x, "0");
    a = sdot_lane!(a, w[1][0], x, "1");
    b = sdot_lane!(b, w[1][1], x, "1");
    a = sdot_lane!(a, w[2][0], x, "2");
    b = sdot_lane!(b, w[2][1], x, "2");
    a = sdot_lane!(a, w[3][0], x, "3");
    b = sdot_lane!(b, w[3][1], x, "3");
    [a, b, c, d]
}

/// [`sdot_quad`] with `smull`/`smull2` into 16-bit products and `sadalp` into 32-bit pair sums
/// (one product per 16-bit lane, so nothing can overflow whatever the bytes), for any aarch64
/// CPU.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn smull_quad(acc: DotAcc, w: &Quad, x: int8x16_t) -> DotAcc {
    let [mut r01, mut r23, mut r45, mut r67] = acc;
    let x32 = vreinterpretq_s32_s8(x);
    let groups = [
        vdupq_laneq_s32::<0>(x32),
        vdupq_laneq_s32::<1>(x32),
        vdupq_laneq_s32::<2>(x32),
        vdupq_laneq_s32::<3>(x32),
    ];
    for (wk, g) in w.iter().zip(groups) {
        let g = vreinterpretq_s8_s32(g);
        let gl = vget_low_s8(g);
        r01 = vpadalq_s16(r01, vmull_s8(vget_low_s8(wk[0]), gl));
        r23 = vpadalq_s16(r23, vmull_high_s8(wk[0], g));
        r45 = vpadalq_s16(r45, vmull_s8(vget_low_s8(wk[1]), gl));
        r67 = vpadalq_s16(r67, vmull_high_s8(wk[1], g));
    }
    [r01, r23, r45, r67]
}

/// 16 bytes from `b` as a register (any alignment).
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn load16(b: &[u8]) -> uint8x16_t {
    assert!(b.len() >= 16);
    // SAFETY: the assertion guarantees 16 readable bytes; `ld1` has no alignment requirement.
    unsafe { vld1q_u8(b.as_ptr()) }
}

/// 16 activation quants from `q` as a register.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn load16_i8(q: &[i8]) -> int8x16_t {
    assert!(q.len() >= 16);
    // SAFETY: as in `load16`.
    unsafe { vld1q_s8(q.as_ptr()) }
}

/// A 32-byte packed vector at the start of `b`: rows 0–3, rows 4–7.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn load_rows8(b: &[u8]) -> [uint8x16_t; 2] {
    [load16(b), load16(&b[16..])]
}

/// 8 f16 values (16 bytes at the start of `b`) as f32: rows 0–3, rows 4–7. Exact, as every
/// f16 is an f32; `fcvtl` is base ARMv8, written as assembly because Rust's f16 vector types are
/// not stable.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn f16x8(b: &[u8]) -> [float32x4_t; 2] {
    let h = load16(b);
    let (lo, hi): (float32x4_t, float32x4_t);
    // SAFETY: SIMD only: one register in, two out, no memory or flags touched; `fcvtl`/`fcvtl2`
    // are in every aarch64 CPU.
    unsafe {
        asm!(
            "fcvtl {lo:v}.4s, {h:v}.4h",
            "fcvtl2 {hi:v}.4s, {h:v}.8h",
            h = in(vreg) h,
            lo = out(vreg) lo,
            hi = out(vreg) hi,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    [lo, hi]
}

/// 8 bytes at the start of `b` (one per row) as i32: rows 0–3, rows 4–7; signed or not.
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn bytes8_to_i32(b: &[u8], signed: bool) -> [int32x4_t; 2] {
    assert!(b.len() >= 8);
    // SAFETY: the assertion guarantees 8 readable bytes; `ld1` has no alignment requirement.
    let v = unsafe { vld1_u8(b.as_ptr()) };
    let wide = if signed {
        vmovl_s8(vreinterpret_s8_u8(v))
    } else {
        vreinterpretq_s16_u16(vmovl_u8(v))
    };
    [vmovl_s16(vget_low_s16(wide)), vmovl_high_s16(wide)]
}

/// 8 row sums as f32, rounded to nearest as `as f32` does (each kernel then applies its
/// format's scales in the scalar reference's order, so the results have the same bits).
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn to_f32(v: [int32x4_t; 2]) -> [float32x4_t; 2] {
    [vcvtq_f32_s32(v[0]), vcvtq_f32_s32(v[1])]
}
