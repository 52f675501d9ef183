//! The physical reference of compute-bound figures: which arithmetic unit a matmul of each
//! weight format runs on ([`ComputeUnit::for_format`]), and that unit's peak on this machine,
//! measured ([`ComputeUnit::peak_gops`]): every thread of the kernel pool runs a loop of
//! independent multiply-accumulate instructions (enough accumulators to hide their latency) and
//! the operations done are divided by the wall time. A prefill's or an encoder's achieved
//! GFLOP/s beside it says how far the kernels are from what the silicon can do, as decode's
//! bandwidth bound does for memory.
//!
//! Operations count a multiply and an add as two (an int8 `vpdpbusd` lane does four of each).

use std::sync::OnceLock;
use std::time::Instant;

use crate::format::WeightFormat;
use crate::matmul::Isa;

/// The arithmetic a matmul's inner loop runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ComputeUnit {
    /// f32 fused multiply-add (the float formats' register tiles).
    F32Fma,
    /// bf16 pairs into f32 (`vdpbf16ps`): bf16 matrices and the encoders where the CPU has it.
    Bf16Dot,
    /// int8 dot products into i32 (`vpdpbusd`, AVX2's `maddubs`, NEON's `sdot`): the block
    /// formats against activations quantised to 8 bits.
    Int8Dot,
}

impl ComputeUnit {
    /// Every unit, in [`ComputeUnit::index`] order.
    pub const ALL: [ComputeUnit; 3] = [ComputeUnit::F32Fma, ComputeUnit::Bf16Dot, ComputeUnit::Int8Dot];

    /// Position in [`ComputeUnit::ALL`] (for per-unit tallies).
    pub fn index(self) -> usize {
        match self {
            ComputeUnit::F32Fma => 0,
            ComputeUnit::Bf16Dot => 1,
            ComputeUnit::Int8Dot => 2,
        }
    }

    /// The unit a matmul over `fmt` runs on with this CPU's best kernels (`bf16`: whether bf16
    /// matrices multiply in bf16, [`crate::Tuning::bf16`] and the caller's policy).
    pub fn for_format(fmt: WeightFormat, bf16: bool) -> ComputeUnit {
        match fmt {
            WeightFormat::F32 | WeightFormat::F16 => ComputeUnit::F32Fma,
            WeightFormat::BF16 if bf16 && crate::Bf16Matrix::available() => ComputeUnit::Bf16Dot,
            WeightFormat::BF16 => ComputeUnit::F32Fma,
            _ => ComputeUnit::Int8Dot,
        }
    }

    /// What this unit is on this CPU, e.g. `int8 dot (AVX-512 VNNI, zmm)`.
    pub fn describe(self) -> &'static str {
        let f = crate::Features::get();
        let isa = Isa::best();
        match self {
            ComputeUnit::F32Fma if f.avx512f => "f32 FMA (AVX-512)",
            ComputeUnit::F32Fma if isa == Isa::Avx2 || isa == Isa::Avx2Vnni => "f32 FMA (AVX2)",
            ComputeUnit::F32Fma if f.neon => "f32 FMA (NEON)",
            ComputeUnit::F32Fma => "f32 (scalar)",
            ComputeUnit::Bf16Dot if f.avx512bf16 => "bf16 dot (AVX-512 BF16)",
            ComputeUnit::Bf16Dot => "bf16 dot (not on this CPU)",
            ComputeUnit::Int8Dot if isa == Isa::Avx2Vnni && f.avx512f => "int8 dot (AVX-512 VNNI)",
            ComputeUnit::Int8Dot if isa == Isa::Avx2Vnni || isa == Isa::Avx2 => "int8 dot (AVX2 maddubs)",
            ComputeUnit::Int8Dot if isa == Isa::NeonDot => "int8 dot (NEON sdot)",
            ComputeUnit::Int8Dot => "int8 (scalar)",
        }
    }

    /// Measured peak of this unit over the kernel pool's threads, in giga-operations per second
    /// (measured once per process and unit; `None` where the CPU lacks the unit or only the
    /// scalar path runs it).
    pub fn peak_gops(self) -> Option<f64> {
        static PEAKS: [OnceLock<Option<f64>>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        *PEAKS[self.index()].get_or_init(|| measure(self))
    }
}

/// Inner-loop iterations per timed task (each a few microseconds of one core's work).
const ITERS: usize = 20_000;

/// Operations per second of `unit` with every pool thread running its loop, the best of a few
/// tries (another process on a shared machine only ever makes a try slower).
fn measure(unit: ComputeUnit) -> Option<f64> {
    let loop_fn = kernel_for(unit)?;
    let pool = crate::pool::global();
    let tasks = pool.threads();
    let ops_per_task = loop_fn.ops_per_iter as f64 * ITERS as f64;
    let mut best: f64 = 0.0;
    for _ in 0..7 {
        let t = Instant::now();
        pool.run(tasks * 8, &|_| {
            std::hint::black_box((loop_fn.run)(ITERS));
        });
        let rate = ops_per_task * (tasks * 8) as f64 / t.elapsed().as_secs_f64() / 1e9;
        best = best.max(rate);
    }
    Some(best)
}

/// One unit's timing loop: `run(iters)` executes `iters` iterations of `ops_per_iter` operations.
#[derive(Clone, Copy)]
struct PeakLoop {
    run: fn(usize) -> f32,
    ops_per_iter: usize,
}

#[cfg(target_arch = "x86_64")]
fn kernel_for(unit: ComputeUnit) -> Option<PeakLoop> {
    let f = crate::Features::get();
    let isa = Isa::best();
    let x86 = isa == Isa::Avx2 || isa == Isa::Avx2Vnni;
    match unit {
        ComputeUnit::F32Fma if x86 && f.avx512f => Some(PeakLoop {
            run: |n| {
                // SAFETY: reached only where AVX-512F was detected.
                unsafe { x86::fma512(n) }
            },
            ops_per_iter: x86::ACC * 16 * 2,
        }),
        ComputeUnit::F32Fma if x86 => Some(PeakLoop {
            run: |n| {
                // SAFETY: reached only where AVX2 and FMA were detected (`Isa::available`).
                unsafe { x86::fma256(n) }
            },
            ops_per_iter: x86::ACC * 8 * 2,
        }),
        ComputeUnit::Bf16Dot if f.avx512bf16 && f.avx512f => Some(PeakLoop {
            run: |n| {
                // SAFETY: reached only where AVX-512F and AVX-512 BF16 were detected.
                unsafe { x86::bf16_512(n) }
            },
            ops_per_iter: x86::ACC * 32 * 2,
        }),
        ComputeUnit::Int8Dot if isa == Isa::Avx2Vnni && f.avx512f => Some(PeakLoop {
            run: |n| {
                // SAFETY: reached only where AVX-512F and VNNI were detected.
                unsafe { x86::vnni512(n) }
            },
            ops_per_iter: x86::ACC * 64 * 2,
        }),
        ComputeUnit::Int8Dot if x86 => Some(PeakLoop {
            run: |n| {
                // SAFETY: reached only where AVX2 was detected.
                unsafe { x86::maddubs256(n) }
            },
            ops_per_iter: x86::ACC * 32 * 2,
        }),
        _ => None,
    }
}

#[cfg(target_arch = "aarch64")]
fn kernel_for(unit: ComputeUnit) -> Option<PeakLoop> {
    match unit {
        ComputeUnit::F32Fma => Some(PeakLoop {
            run: neon::fma,
            ops_per_iter: neon::ACC * 4 * 2,
        }),
        ComputeUnit::Int8Dot if Isa::best() == Isa::NeonDot => Some(PeakLoop {
            run: |n| {
                // SAFETY: reached only where the dotprod extension was detected.
                unsafe { neon::sdot(n) }
            },
            ops_per_iter: neon::ACC * 16 * 2,
        }),
        _ => None,
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn kernel_for(_: ComputeUnit) -> Option<PeakLoop> {
    None
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::hint::black_box;

    /// Independent accumulators per loop: more than latency × issue width of any unit here.
    pub const ACC: usize = 12;

    #[target_feature(enable = "avx512f")]
    pub fn fma512(n: usize) -> f32 {
        let (a, b) = (_mm512_set1_ps(black_box(0.999)), _mm512_set1_ps(black_box(1e-7)));
        let mut acc = [_mm512_set1_ps(black_box(1.0)); ACC];
        for _ in 0..n {
            for v in &mut acc {
                *v = _mm512_fmadd_ps(*v, a, b);
            }
        }
        acc.iter().map(|&v| _mm512_reduce_add_ps(v)).sum()
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn fma256(n: usize) -> f32 {
        let (a, b) = (_mm256_set1_ps(black_box(0.999)), _mm256_set1_ps(black_box(1e-7)));
        let mut acc = [_mm256_set1_ps(black_box(1.0)); ACC];
        for _ in 0..n {
            for v in &mut acc {
                *v = _mm256_fmadd_ps(*v, a, b);
            }
        }
        let mut out = [0f32; 8];
        let s = acc.iter().fold(_mm256_setzero_ps(), |s, &v| _mm256_add_ps(s, v));
        // SAFETY: `out` holds 8 f32; unaligned store.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
        out.iter().sum()
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    pub fn bf16_512(n: usize) -> f32 {
        let a: __m512bh = _mm512_cvtne2ps_pbh(_mm512_set1_ps(black_box(0.5)), _mm512_set1_ps(black_box(0.25)));
        let mut acc = [_mm512_setzero_ps(); ACC];
        for _ in 0..n {
            for v in &mut acc {
                *v = _mm512_dpbf16_ps(*v, a, a);
            }
        }
        acc.iter().map(|&v| _mm512_reduce_add_ps(v)).sum()
    }

    #[target_feature(enable = "avx512f,avx512vnni")]
    pub fn vnni512(n: usize) -> f32 {
        let (a, b) = (_mm512_set1_epi8(black_box(3)), _mm512_set1_epi8(black_box(-2)));
        let mut acc = [_mm512_setzero_si512(); ACC];
        for _ in 0..n {
            for v in &mut acc {
                *v = _mm512_dpbusd_epi32(*v, a, b);
            }
        }
        acc.iter().map(|&v| _mm512_reduce_add_epi32(v) as f32).sum()
    }

    /// AVX2's int8 dot as the kernels do it: `maddubs` (u8 × i8 pairs to i16) then `madd` with
    /// ones (pairs to i32) and an add: 32 multiply-adds per three instructions.
    #[target_feature(enable = "avx2")]
    pub fn maddubs256(n: usize) -> f32 {
        let (a, b) = (_mm256_set1_epi8(black_box(3)), _mm256_set1_epi8(black_box(-2)));
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_si256(); ACC];
        for _ in 0..n {
            for v in &mut acc {
                *v = _mm256_add_epi32(*v, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
            }
        }
        let s = acc.iter().fold(_mm256_setzero_si256(), |s, &v| _mm256_add_epi32(s, v));
        let mut out = [0i32; 8];
        // SAFETY: `out` holds 8 i32; unaligned store.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), s) };
        out.iter().map(|&v| v as f32).sum()
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;
    use std::hint::black_box;

    /// Independent accumulators per loop.
    pub const ACC: usize = 16;

    pub fn fma(n: usize) -> f32 {
        // SAFETY: NEON is part of the aarch64 baseline.
        unsafe {
            let (a, b) = (vdupq_n_f32(black_box(0.999)), vdupq_n_f32(black_box(1e-7)));
            let mut acc = [vdupq_n_f32(black_box(1.0)); ACC];
            for _ in 0..n {
                for v in &mut acc {
                    *v = vfmaq_f32(b, *v, a);
                }
            }
            acc.iter().map(|&v| vaddvq_f32(v)).sum()
        }
    }

    /// `sdot` by vector (its intrinsics are not stable: written as `asm!`, as the kernels do).
    #[target_feature(enable = "dotprod")]
    pub fn sdot(n: usize) -> f32 {
        let (a, b) = (vdupq_n_s8(black_box(3)), vdupq_n_s8(black_box(-2)));
        let mut acc = [vdupq_n_s32(0); ACC];
        for _ in 0..n {
            for v in &mut acc {
                // SAFETY: `sdot` reads and writes only these registers; dotprod is enabled here.
                unsafe {
                    std::arch::asm!(
                        "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
                        acc = inout(vreg) *v,
                        a = in(vreg) a,
                        b = in(vreg) b,
                        options(pure, nomem, nostack),
                    );
                }
            }
        }
        acc.iter().map(|&v| vaddvq_s32(v) as f32).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_map_to_their_units() {
        assert_eq!(ComputeUnit::for_format(WeightFormat::F32, true), ComputeUnit::F32Fma);
        assert_eq!(ComputeUnit::for_format(WeightFormat::Q4_K, true), ComputeUnit::Int8Dot);
        assert_eq!(ComputeUnit::for_format(WeightFormat::Q8_0, false), ComputeUnit::Int8Dot);
        assert_eq!(ComputeUnit::for_format(WeightFormat::BF16, false), ComputeUnit::F32Fma);
    }

    #[test]
    fn every_available_unit_measures_a_positive_peak() {
        for unit in [ComputeUnit::F32Fma, ComputeUnit::Bf16Dot, ComputeUnit::Int8Dot] {
            if let Some(p) = unit.peak_gops() {
                assert!(p.is_finite() && p > 0.1, "{}: {p} GOPS", unit.describe());
            }
        }
        #[cfg(target_arch = "x86_64")]
        if Isa::best() != Isa::Scalar {
            assert!(ComputeUnit::F32Fma.peak_gops().is_some());
            assert!(ComputeUnit::Int8Dot.peak_gops().is_some());
        }
    }
}
