//! The two x86 vector widths the kernels run at, behind one trait, so a kernel is written once
//! and monomorphised per width: [`Avx2`] (256-bit `ymm`, AVX2 + FMA + F16C) and [`Avx512`]
//! (512-bit `zmm`, AVX-512F/DQ on top).
//!
//! A width is a zero-sized token whose value exists only where its features were detected
//! ([`Avx2::detect`], [`Avx512::detect`], or the `unsafe` `assume`), so its operations are safe
//! to call. They are `#[inline(always)]`: a generic kernel is written as `#[inline(always)]`
//! functions taking the token, called from small `#[target_feature]` entry points, one per width,
//! so the whole kernel is compiled with that width's features and every intrinsic is inlined.

use std::arch::x86_64::*;

use crate::fp16::f16_to_f32;

/// An x86 vector width: f32 arithmetic on `F32S` lanes, and the loads the kernels need.
pub(crate) trait Lanes: Copy {
    /// A register of f32 lanes.
    type F32: Copy;
    /// The horizontal sums of one [`Lanes::F32`] of eight-lane partial sums per row
    /// (`[f32; ROWS8]`).
    type Sums: Copy + AsRef<[f32]>;
    /// f32 lanes per register (8 or 16).
    const F32S: usize;
    /// Rows whose eight-lane partial sums one register holds (1 or 2: row `r` in lanes
    /// `8r .. 8r + 8`).
    const ROWS8: usize;

    /// All lanes zero.
    fn zero(self) -> Self::F32;
    /// Every lane `x`.
    fn splat(self, x: f32) -> Self::F32;
    /// `a · b + c`, fused, per lane.
    fn fmadd(self, a: Self::F32, b: Self::F32, c: Self::F32) -> Self::F32;
    /// The first [`Lanes::F32S`] values of `x` (panics if shorter).
    fn load(self, x: &[f32]) -> Self::F32;
    /// Store into the first [`Lanes::F32S`] values of `x` (panics if shorter).
    fn store(self, x: &mut [f32], v: Self::F32);
    /// The first eight values of `x`, in each of the [`Lanes::ROWS8`] eight-lane parts.
    fn load8_each(self, x: &[f32]) -> Self::F32;
    /// [`Lanes::F32S`] cached values of `m` at `at` as f32 (panics past the end).
    fn load_cache<T: CacheValue>(self, m: &[T], at: usize) -> Self::F32;
    /// Eight cached values at `at + r·stride` in part `r`, for each of the [`Lanes::ROWS8`]
    /// parts (panics past the end).
    fn load8_rows<T: CacheValue>(self, m: &[T], at: usize, stride: usize) -> Self::F32;
    /// Each eight-lane part reduced as `vector::dot` reduces its eight partial sums:
    /// `h_i = a_i + a_(i+4)`, then `(h_0 + h_1) + (h_2 + h_3)`.
    fn reduce8(self, v: Self::F32) -> Self::Sums;
}

/// A KV-cache value type (f32, or f16 bits), widened to f32 by the loads.
pub(crate) trait CacheValue: Copy {
    /// This value as f32.
    fn widen(self) -> f32;
    /// Eight values at `m[at..at + 8]` as f32.
    ///
    /// # Safety
    /// AVX2 and F16C must be available (bounds are checked).
    unsafe fn load8(m: &[Self], at: usize) -> __m256;
    /// Sixteen values at `m[at..at + 16]` as f32.
    ///
    /// # Safety
    /// AVX-512F must be available (bounds are checked).
    unsafe fn load16(m: &[Self], at: usize) -> __m512;
    /// Values `a .. a + 8` in the low half and `b .. b + 8` in the high half.
    ///
    /// # Safety
    /// AVX-512F/DQ must be available (bounds are checked).
    unsafe fn load8x2(m: &[Self], a: usize, b: usize) -> __m512;
}

impl CacheValue for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    unsafe fn load8(m: &[f32], at: usize) -> __m256 {
        let c = &m[at..at + 8];
        // SAFETY: `c` holds exactly 8 f32; unaligned load; AVX per the caller.
        unsafe { _mm256_loadu_ps(c.as_ptr()) }
    }
    #[inline(always)]
    unsafe fn load16(m: &[f32], at: usize) -> __m512 {
        let c = &m[at..at + 16];
        // SAFETY: `c` holds exactly 16 f32; unaligned load; AVX-512F per the caller.
        unsafe { _mm512_loadu_ps(c.as_ptr()) }
    }
    #[inline(always)]
    unsafe fn load8x2(m: &[f32], a: usize, b: usize) -> __m512 {
        let (lo, hi) = (&m[a..a + 8], &m[b..b + 8]);
        // SAFETY: each slice holds exactly 8 f32; unaligned loads; AVX-512F/DQ per the caller.
        unsafe {
            _mm512_insertf32x8::<1>(
                _mm512_castps256_ps512(_mm256_loadu_ps(lo.as_ptr())),
                _mm256_loadu_ps(hi.as_ptr()),
            )
        }
    }
}

impl CacheValue for u16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f16_to_f32(self)
    }
    #[inline(always)]
    unsafe fn load8(m: &[u16], at: usize) -> __m256 {
        let c = &m[at..at + 8];
        // SAFETY: `c` holds exactly 8 u16 (16 bytes); unaligned load; F16C per the caller.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(c.as_ptr().cast())) }
    }
    #[inline(always)]
    unsafe fn load16(m: &[u16], at: usize) -> __m512 {
        let c = &m[at..at + 16];
        // SAFETY: `c` holds exactly 16 u16 (32 bytes); unaligned load; AVX-512F per the caller.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(c.as_ptr().cast())) }
    }
    #[inline(always)]
    unsafe fn load8x2(m: &[u16], a: usize, b: usize) -> __m512 {
        let (lo, hi) = (&m[a..a + 8], &m[b..b + 8]);
        // SAFETY: each slice holds exactly 8 u16 (16 bytes); unaligned loads; AVX-512F per the
        // caller (AVX2 for the insert is implied).
        unsafe {
            let both = _mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(_mm_loadu_si128(lo.as_ptr().cast())),
                _mm_loadu_si128(hi.as_ptr().cast()),
            );
            _mm512_cvtph_ps(both)
        }
    }
}

/// 256-bit registers: AVX2, FMA and F16C.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2(());

impl Avx2 {
    /// The token, where this CPU has AVX2, FMA and F16C.
    pub(crate) fn detect() -> Option<Self> {
        crate::Features::get().avx2_fma_f16c().then_some(Self(()))
    }

    /// The token without a check.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available (as inside a function compiled for them and called
    /// only where they were detected).
    #[inline(always)]
    pub(crate) unsafe fn assume() -> Self {
        Self(())
    }
}

// SAFETY (every `unsafe` block in this impl): an `Avx2` value exists only where AVX2, FMA and
// F16C were detected (see its constructors), which is all these intrinsics need; slices are
// bounds-checked before the unaligned loads and stores.
impl Lanes for Avx2 {
    type F32 = __m256;
    type Sums = [f32; 1];
    const F32S: usize = 8;
    const ROWS8: usize = 1;

    #[inline(always)]
    fn zero(self) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    fn fmadd(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn load(self, x: &[f32]) -> __m256 {
        let x = &x[..8];
        // SAFETY: see the impl; `x` holds exactly 8 f32.
        unsafe { _mm256_loadu_ps(x.as_ptr()) }
    }
    #[inline(always)]
    fn store(self, x: &mut [f32], v: __m256) {
        let x = &mut x[..8];
        // SAFETY: see the impl; `x` holds exactly 8 f32.
        unsafe { _mm256_storeu_ps(x.as_mut_ptr(), v) }
    }
    #[inline(always)]
    fn load8_each(self, x: &[f32]) -> __m256 {
        self.load(x)
    }
    #[inline(always)]
    fn load_cache<T: CacheValue>(self, m: &[T], at: usize) -> __m256 {
        // SAFETY: see the impl (AVX2 and F16C).
        unsafe { T::load8(m, at) }
    }
    #[inline(always)]
    fn load8_rows<T: CacheValue>(self, m: &[T], at: usize, _stride: usize) -> __m256 {
        self.load_cache(m, at)
    }
    #[inline(always)]
    fn reduce8(self, a: __m256) -> [f32; 1] {
        // SAFETY: see the impl.
        unsafe {
            let hsum = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
            let t = _mm_hadd_ps(hsum, hsum);
            [_mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)))]
        }
    }
}

/// 512-bit registers: AVX-512F and DQ, on top of [`Avx2`]'s features.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512(());

impl Avx512 {
    /// The token, where this CPU has AVX-512F/DQ besides AVX2, FMA and F16C.
    pub(crate) fn detect() -> Option<Self> {
        let f = crate::Features::get();
        (f.avx2_fma_f16c() && f.avx512f && f.avx512dq).then_some(Self(()))
    }

    /// The token without a check.
    ///
    /// # Safety
    /// AVX2, FMA, F16C, AVX-512F and AVX-512DQ must be available.
    #[inline(always)]
    pub(crate) unsafe fn assume() -> Self {
        Self(())
    }
}

// SAFETY (every `unsafe` block in this impl): an `Avx512` value exists only where AVX2, FMA,
// F16C, AVX-512F and AVX-512DQ were detected (see its constructors), which is all these
// intrinsics need; slices are bounds-checked before the unaligned loads and stores.
impl Lanes for Avx512 {
    type F32 = __m512;
    type Sums = [f32; 2];
    const F32S: usize = 16;
    const ROWS8: usize = 2;

    #[inline(always)]
    fn zero(self) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    fn fmadd(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn load(self, x: &[f32]) -> __m512 {
        let x = &x[..16];
        // SAFETY: see the impl; `x` holds exactly 16 f32.
        unsafe { _mm512_loadu_ps(x.as_ptr()) }
    }
    #[inline(always)]
    fn store(self, x: &mut [f32], v: __m512) {
        let x = &mut x[..16];
        // SAFETY: see the impl; `x` holds exactly 16 f32.
        unsafe { _mm512_storeu_ps(x.as_mut_ptr(), v) }
    }
    #[inline(always)]
    fn load8_each(self, x: &[f32]) -> __m512 {
        let x = &x[..8];
        // SAFETY: see the impl; `x` holds exactly 8 f32, copied to both halves.
        unsafe { _mm512_broadcast_f32x8(_mm256_loadu_ps(x.as_ptr())) }
    }
    #[inline(always)]
    fn load_cache<T: CacheValue>(self, m: &[T], at: usize) -> __m512 {
        // SAFETY: see the impl (AVX-512F).
        unsafe { T::load16(m, at) }
    }
    #[inline(always)]
    fn load8_rows<T: CacheValue>(self, m: &[T], at: usize, stride: usize) -> __m512 {
        // SAFETY: see the impl (AVX-512F/DQ).
        unsafe { T::load8x2(m, at, at + stride) }
    }
    #[inline(always)]
    fn reduce8(self, acc: __m512) -> [f32; 2] {
        // SAFETY: see the impl.
        unsafe {
            // Swap the 128-bit quarters within each half: lanes 0..4 then hold h for row A,
            // 8..12 for row B.
            let h = _mm512_add_ps(acc, _mm512_shuffle_f32x4::<0b10_11_00_01>(acc, acc));
            let u = _mm512_add_ps(h, _mm512_permute_ps::<0b10_11_00_01>(h));
            let v = _mm512_add_ps(u, _mm512_permute_ps::<0b01_00_11_10>(u));
            [_mm512_cvtss_f32(v), _mm_cvtss_f32(_mm512_extractf32x4_ps::<2>(v))]
        }
    }
}
