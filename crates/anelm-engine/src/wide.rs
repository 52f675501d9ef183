//! The engine's own f32 loops (RMSNorm, RoPE, the softmax of attention) compiled a second and
//! third time for AVX2 and AVX-512, chosen once per process from what the CPU has.
//!
//! Why: the crate is built for baseline x86-64 (SSE2, four floats per instruction), and these
//! loops run per lane on every layer of every step, much of it on the caller's thread while the
//! kernel pool's workers wait: at four streams they were ~0.3 ms of a ~4 ms SmolLM2 step.
//! The copies run the same scalar source with wider registers. Rust never fuses a multiply and an
//! add on its own and every loop here is element-wise (sums keep their fixed partial-sum order),
//! so results are bit-identical whichever copy runs (tested). A loop that fuses on purpose
//! (`f32::mul_add`) gets the hardware's FMA in the AVX2 and AVX-512 copies (both are compiled
//! with it) and the C library's correctly rounded `fmaf` in the baseline one: the same bits.

// Elsewhere (aarch64: NEON is the baseline) only the portable bodies exist.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

/// The widest vector registers this CPU offers the engine's loops (ordered narrow to wide).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Width {
    /// The build's baseline (SSE2 on x86-64, NEON on aarch64).
    Base,
    /// 256-bit AVX2 (with FMA, for the loops that fuse on purpose).
    Avx2,
    /// 512-bit AVX-512 (F, DQ, BW, VL).
    Avx512,
}

/// [`Width`] of this CPU, detected once; `ANELM_ENGINE_SIMD=base|avx2` caps it for A/B runs.
pub(crate) fn width() -> Width {
    static W: std::sync::OnceLock<Width> = std::sync::OnceLock::new();
    *W.get_or_init(|| {
        let cap = match anelm_kernels::Tuning::get().engine_simd.as_deref() {
            Some("base") => Width::Base,
            Some("avx2") => Width::Avx2,
            _ => Width::Avx512,
        };
        detect().min(cap)
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Width {
    if anelm_kernels::avx512() {
        Width::Avx512
    } else if anelm_kernels::avx2_fma() {
        Width::Avx2
    } else {
        Width::Base
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Width {
    Width::Base
}

/// `fn name(args) -> ret = baseline { body }` defines `baseline`, an `#[inline(always)]` function
/// with `body` (the portable code, which tests call to compare), and `name`, which runs that
/// body compiled for the widest [`Width`] this CPU has.
macro_rules! multiversion {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? = $base:ident $body:block
    ) => {
        #[inline(always)]
        fn $base($($arg: $ty),*) $(-> $ret)? $body

        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")]
                fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $base($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $base($($arg),*)
                }
                match $crate::wide::width() {
                    // SAFETY: `width()` reports AVX-512 only where the CPU has F, DQ, BW and VL
                    // (and so AVX2).
                    $crate::wide::Width::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: `width()` reports AVX2 only where the CPU has it and FMA.
                    $crate::wide::Width::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::wide::Width::Base => {}
                }
            }
            $base($($arg),*)
        }
    };
}

pub(crate) use multiversion;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_never_widens() {
        assert_eq!(Width::Avx2.min(Width::Avx512), Width::Avx2);
        assert_eq!(Width::Avx512.min(Width::Base), Width::Base);
        assert_eq!(Width::Base.min(Width::Avx2), Width::Base);
    }
}
