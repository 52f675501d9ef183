//! The x86 register widths of the packed integer-dot kernels behind one trait, so a kernel over
//! a group of interleaved rows is written once and monomorphised per width: [`Ymm`] (8 rows per
//! 256-bit register; the u8 × i8 dot as AVX2's `maddubs` + `madd`, or with `VNNI` one
//! `vpdpbusd`) and [`Zmm`] (16 rows per 512-bit register, AVX-512 VNNI; `NTA` picks the weight
//! stream's prefetch hint, see `packed_x86_wide::weight_prefetch_nta`; `GFNI` the high-nibble
//! extraction).
//!
//! As in `lanes_x86`, a width is a zero-sized token that exists only where its features are
//! available (made by `unsafe` `assume` inside a `#[target_feature]` function reached only after
//! detection), so its `#[inline(always)]` operations are safe and compile to the bare
//! instructions once inlined into that function.

use std::arch::x86_64::*;

use crate::packed_x86_wide::prefetch_lines;

/// A register width of the packed kernels: one i32 or f32 lane per row of a group of
/// [`IntLanes::ROWS`] rows, and the byte vectors that hold four bytes of each of those rows.
pub(crate) trait IntLanes: Copy {
    /// Integer register (`4 · ROWS` bytes).
    type I: Copy;
    /// f32 register (`ROWS` lanes).
    type F: Copy;
    /// One lane's results for the group's rows (`[f32; ROWS]`).
    type Out: AsMut<[f32]>;
    /// Rows of one interleaved group.
    const ROWS: usize;
    /// Whether [`IntLanes::dot`] saturates for unsigned weights above 128 (AVX2's `maddubs`
    /// pairs): such kernels move the weights' sign onto the activations instead
    /// ([`IntLanes::abs8`], [`IntLanes::sign8`]).
    const SATURATING_DOT: bool;

    /// All bits zero.
    fn zero_i(self) -> Self::I;
    /// Every byte `b`.
    fn splat8(self, b: u8) -> Self::I;
    /// Every i32 lane `v`.
    fn splat32(self, v: i32) -> Self::I;
    /// `4 · ROWS` bytes of `b` (panics if shorter).
    fn load(self, b: &[u8]) -> Self::I;
    /// Bitwise and.
    fn and(self, a: Self::I, b: Self::I) -> Self::I;
    /// Bitwise or.
    fn or(self, a: Self::I, b: Self::I) -> Self::I;
    /// Each 16-bit lane shifted left by `N` (1 to 7).
    fn shl16<const N: i32>(self, a: Self::I) -> Self::I;
    /// Each 16-bit lane shifted right (logically) by `N` (1 to 7).
    fn shr16<const N: i32>(self, a: Self::I) -> Self::I;
    /// i32 lanes added.
    fn add32(self, a: Self::I, b: Self::I) -> Self::I;
    /// `acc + Σ` of the u8 × i8 products of `w` and `x` in groups of four (exact for the
    /// packed formats' ranges, see `packed_x86::acc_dot`).
    fn dot(self, acc: Self::I, w: Self::I, x: Self::I) -> Self::I;
    /// The 16 bytes of `t` in every 128-bit lane (a [`IntLanes::lookup16`] table).
    fn table16(self, t: &[u8; 16]) -> Self::I;
    /// Byte `i` of `idx` (each 0..16) replaced by byte `idx[i]` of `table`'s 128-bit lane.
    fn lookup16(self, table: Self::I, idx: Self::I) -> Self::I;
    /// `|a|` per signed byte (only where [`IntLanes::SATURATING_DOT`]).
    fn abs8(self, a: Self::I) -> Self::I;
    /// `a` with the sign of `b` per signed byte, 0 where `b` is 0 (only where
    /// [`IntLanes::SATURATING_DOT`]).
    fn sign8(self, a: Self::I, b: Self::I) -> Self::I;
    /// All f32 lanes zero.
    fn zero_f(self) -> Self::F;
    /// Every f32 lane `x`.
    fn splat_f(self, x: f32) -> Self::F;
    /// `ROWS` f16 values at `b` as f32 (panics if shorter).
    fn f16s(self, b: &[u8]) -> Self::F;
    /// i32 lanes converted to f32.
    fn to_f32(self, a: Self::I) -> Self::F;
    /// f32 lanes added.
    fn add_f(self, a: Self::F, b: Self::F) -> Self::F;
    /// f32 lanes multiplied.
    fn mul_f(self, a: Self::F, b: Self::F) -> Self::F;
    /// `a · b + c`, fused, per f32 lane.
    fn fmadd_f(self, a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// The high nibble of every byte of `v`, as a value 0..16 (`mask` holds 0x0F in every byte).
    #[inline(always)]
    fn high_nibbles(self, v: Self::I, mask: Self::I) -> Self::I {
        self.and(self.shr16::<4>(v), mask)
    }
    /// Store the `ROWS` lanes into `out`.
    fn store(self, out: &mut Self::Out, v: Self::F);
    /// Store an integer register's `4 · ROWS` bytes at the start of `out` (panics if shorter).
    fn store_i(self, out: &mut [u8], v: Self::I);
    /// Prefetch `lines` cache lines of the weight stream, this width's distance past `p` (a
    /// prefetch never faults, so the address may lie past the matrix), with its stream hint.
    fn prefetch_stream(self, p: &[u8], lines: usize);
    /// Part `part` of `parts` of the block of `bytes` bytes two blocks past `p`, with this
    /// width's stream hint (`packed_x86_wide::prefetch_part_ahead`).
    fn prefetch_part_ahead(self, p: &[u8], bytes: usize, part: usize, parts: usize);
    /// i32 lanes multiplied, the low 32 bits of each product kept.
    fn mullo32(self, a: Self::I, b: Self::I) -> Self::I;
    /// The first `ROWS` bytes of `b` as signed values, one per i32 lane (panics if shorter).
    fn i8s_to_i32(self, b: &[u8]) -> Self::I;
}

/// Bytes ahead of the current block that the 8-row kernels prefetch.
const YMM_PREFETCH: usize = crate::packed_x86::PREFETCH;
/// Bytes ahead of the current block that the 16-row kernels prefetch.
const ZMM_PREFETCH: usize = crate::packed_x86_wide::PREFETCH;

/// 8-row groups in 256-bit registers: AVX2, FMA, F16C, and with `VNNI` AVX-512 VNNI/VL.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ymm<const VNNI: bool>(());

impl<const VNNI: bool> Ymm<VNNI> {
    /// The token without a check.
    ///
    /// # Safety
    /// AVX2, FMA and F16C (and with `VNNI`, AVX-512 VNNI and VL) must be available.
    #[inline(always)]
    pub(crate) unsafe fn assume() -> Self {
        Self(())
    }
}

// SAFETY (every `unsafe` block in this impl): a `Ymm` exists only where its features are
// available (see `assume`): AVX2, FMA and F16C, plus AVX-512 VNNI/VL for `dpbusd` with `VNNI`;
// slices are bounds-checked before every unaligned load and store.
impl<const VNNI: bool> IntLanes for Ymm<VNNI> {
    type I = __m256i;
    type F = __m256;
    type Out = [f32; 8];
    const ROWS: usize = 8;
    const SATURATING_DOT: bool = !VNNI;

    #[inline(always)]
    fn zero_i(self) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    fn splat8(self, b: u8) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_set1_epi8(b as i8) }
    }
    #[inline(always)]
    fn splat32(self, v: i32) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_set1_epi32(v) }
    }
    #[inline(always)]
    fn load(self, b: &[u8]) -> __m256i {
        let b = &b[..32];
        // SAFETY: see the impl; `b` holds 32 bytes.
        unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
    }
    #[inline(always)]
    fn and(self, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_and_si256(a, b) }
    }
    #[inline(always)]
    fn or(self, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_or_si256(a, b) }
    }
    #[inline(always)]
    fn shl16<const N: i32>(self, a: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_slli_epi16::<N>(a) }
    }
    #[inline(always)]
    fn shr16<const N: i32>(self, a: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_srli_epi16::<N>(a) }
    }
    #[inline(always)]
    fn add32(self, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_add_epi32(a, b) }
    }
    #[inline(always)]
    fn dot(self, acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        // SAFETY: see the impl (`dpbusd` only with `VNNI`).
        unsafe {
            if VNNI {
                _mm256_dpbusd_epi32(acc, w, x)
            } else {
                _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)))
            }
        }
    }
    #[inline(always)]
    fn table16(self, t: &[u8; 16]) -> __m256i {
        // SAFETY: see the impl; `t` holds 16 bytes.
        unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr().cast())) }
    }
    #[inline(always)]
    fn lookup16(self, table: __m256i, idx: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_shuffle_epi8(table, idx) }
    }
    #[inline(always)]
    fn abs8(self, a: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_sign_epi8(a, a) }
    }
    #[inline(always)]
    fn sign8(self, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_sign_epi8(a, b) }
    }
    #[inline(always)]
    fn zero_f(self) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    fn splat_f(self, x: f32) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    fn f16s(self, b: &[u8]) -> __m256 {
        let b = &b[..16];
        // SAFETY: see the impl (F16C); `b` holds 16 bytes.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().cast())) }
    }
    #[inline(always)]
    fn to_f32(self, a: __m256i) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_cvtepi32_ps(a) }
    }
    #[inline(always)]
    fn add_f(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    fn mul_f(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    fn fmadd_f(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: see the impl (FMA).
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn store(self, out: &mut [f32; 8], v: __m256) {
        // SAFETY: see the impl; `out` holds exactly 8 f32.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) }
    }
    #[inline(always)]
    fn store_i(self, out: &mut [u8], v: __m256i) {
        let out = &mut out[..32];
        // SAFETY: see the impl; `out` holds 32 bytes.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), v) }
    }
    #[inline(always)]
    fn prefetch_stream(self, p: &[u8], lines: usize) {
        prefetch_lines(p, YMM_PREFETCH, lines, false);
    }
    #[inline(always)]
    fn prefetch_part_ahead(self, p: &[u8], bytes: usize, part: usize, parts: usize) {
        crate::packed_x86_wide::prefetch_part_ahead(p, bytes, part, parts, false);
    }
    #[inline(always)]
    fn mullo32(self, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_mullo_epi32(a, b) }
    }
    #[inline(always)]
    fn i8s_to_i32(self, b: &[u8]) -> __m256i {
        let b = &b[..8];
        // SAFETY: see the impl; `b` holds 8 bytes (an unaligned 64-bit load).
        unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.as_ptr().cast())) }
    }
}

/// 16-row groups in 512-bit registers: AVX2, FMA, F16C, AVX-512F/BW/VL/VNNI; the weight stream
/// prefetched non-temporally when `NTA`; high nibbles through GFNI when `GFNI`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Zmm<const NTA: bool, const GFNI: bool>(());

impl<const NTA: bool, const GFNI: bool> Zmm<NTA, GFNI> {
    /// The token without a check.
    ///
    /// # Safety
    /// AVX2, FMA, F16C and AVX-512F, BW, VL and VNNI (and with `GFNI`, GFNI) must be available.
    #[inline(always)]
    pub(crate) unsafe fn assume() -> Self {
        Self(())
    }
}

// SAFETY (every `unsafe` block in this impl): a `Zmm` exists only where AVX2, FMA, F16C and
// AVX-512F/BW/VL/VNNI (and GFNI with `GFNI`) are available (see `assume`); slices are
// bounds-checked before every unaligned load and store.
impl<const NTA: bool, const GFNI: bool> IntLanes for Zmm<NTA, GFNI> {
    type I = __m512i;
    type F = __m512;
    type Out = [f32; 16];
    const ROWS: usize = 16;
    const SATURATING_DOT: bool = false;

    #[inline(always)]
    fn zero_i(self) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_setzero_si512() }
    }
    #[inline(always)]
    fn splat8(self, b: u8) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_set1_epi8(b as i8) }
    }
    #[inline(always)]
    fn splat32(self, v: i32) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_set1_epi32(v) }
    }
    #[inline(always)]
    fn load(self, b: &[u8]) -> __m512i {
        let b = &b[..64];
        // SAFETY: see the impl; `b` holds 64 bytes.
        unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
    }
    #[inline(always)]
    fn and(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_and_si512(a, b) }
    }
    #[inline(always)]
    fn or(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_or_si512(a, b) }
    }
    #[inline(always)]
    fn shl16<const N: i32>(self, a: __m512i) -> __m512i {
        // `_mm512_slli_epi16` takes its count as u32, the 256-bit one as i32.
        // SAFETY: see the impl.
        unsafe {
            match N {
                1 => _mm512_slli_epi16::<1>(a),
                2 => _mm512_slli_epi16::<2>(a),
                3 => _mm512_slli_epi16::<3>(a),
                4 => _mm512_slli_epi16::<4>(a),
                5 => _mm512_slli_epi16::<5>(a),
                6 => _mm512_slli_epi16::<6>(a),
                7 => _mm512_slli_epi16::<7>(a),
                _ => unreachable!("the kernels shift by 1 to 7"),
            }
        }
    }
    #[inline(always)]
    fn shr16<const N: i32>(self, a: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe {
            match N {
                1 => _mm512_srli_epi16::<1>(a),
                2 => _mm512_srli_epi16::<2>(a),
                3 => _mm512_srli_epi16::<3>(a),
                4 => _mm512_srli_epi16::<4>(a),
                5 => _mm512_srli_epi16::<5>(a),
                6 => _mm512_srli_epi16::<6>(a),
                7 => _mm512_srli_epi16::<7>(a),
                _ => unreachable!("the kernels shift by 1 to 7"),
            }
        }
    }
    #[inline(always)]
    fn add32(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    fn dot(self, acc: __m512i, w: __m512i, x: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_dpbusd_epi32(acc, w, x) }
    }
    #[inline(always)]
    fn table16(self, t: &[u8; 16]) -> __m512i {
        // SAFETY: see the impl; `t` holds 16 bytes.
        unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(t.as_ptr().cast())) }
    }
    #[inline(always)]
    fn lookup16(self, table: __m512i, idx: __m512i) -> __m512i {
        // SAFETY: see the impl (AVX-512BW).
        unsafe { _mm512_shuffle_epi8(table, idx) }
    }
    #[inline(always)]
    fn abs8(self, a: __m512i) -> __m512i {
        // SAFETY: see the impl (AVX-512BW).
        unsafe { _mm512_abs_epi8(a) }
    }
    #[inline(always)]
    fn sign8(self, a: __m512i, b: __m512i) -> __m512i {
        // AVX-512 has no `vpsignb`: negate where `b < 0`, zero where `b == 0`.
        // SAFETY: see the impl (AVX-512BW).
        unsafe {
            let zero = _mm512_setzero_si512();
            let neg = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(b), zero, a);
            _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(b, b), neg)
        }
    }
    #[inline(always)]
    fn zero_f(self) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    fn splat_f(self, x: f32) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    fn f16s(self, b: &[u8]) -> __m512 {
        let b = &b[..32];
        // SAFETY: see the impl; `b` holds 32 bytes.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(b.as_ptr().cast())) }
    }
    #[inline(always)]
    fn to_f32(self, a: __m512i) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_cvtepi32_ps(a) }
    }
    #[inline(always)]
    fn add_f(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn mul_f(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn fmadd_f(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn high_nibbles(self, v: __m512i, mask: __m512i) -> __m512i {
        if GFNI {
            // One GFNI affine transform instead of a shift and a mask: a uop less per 64
            // weights on the two ports 512-bit code has (field guide, 2026-12-05). Row i of the
            // bit matrix is byte 7 - i: output bit i (< 4) is input bit i + 4.
            const HIGH_NIBBLE: i64 = 0x1020_4080_0000_0000;
            // SAFETY: see the impl (GFNI with `GFNI`).
            unsafe { _mm512_gf2p8affine_epi64_epi8::<0>(v, _mm512_set1_epi64(HIGH_NIBBLE)) }
        } else {
            self.and(self.shr16::<4>(v), mask)
        }
    }
    #[inline(always)]
    fn store(self, out: &mut [f32; 16], v: __m512) {
        // SAFETY: see the impl; `out` holds exactly 16 f32.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) }
    }
    #[inline(always)]
    fn store_i(self, out: &mut [u8], v: __m512i) {
        let out = &mut out[..64];
        // SAFETY: see the impl; `out` holds 64 bytes.
        unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), v) }
    }
    #[inline(always)]
    fn prefetch_stream(self, p: &[u8], lines: usize) {
        prefetch_lines(p, ZMM_PREFETCH, lines, NTA);
    }
    #[inline(always)]
    fn prefetch_part_ahead(self, p: &[u8], bytes: usize, part: usize, parts: usize) {
        crate::packed_x86_wide::prefetch_part_ahead(p, bytes, part, parts, NTA);
    }
    #[inline(always)]
    fn mullo32(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_mullo_epi32(a, b) }
    }
    #[inline(always)]
    fn i8s_to_i32(self, b: &[u8]) -> __m512i {
        let b = &b[..16];
        // SAFETY: see the impl; `b` holds 16 bytes (an unaligned load).
        unsafe { _mm512_cvtepi8_epi32(_mm_loadu_si128(b.as_ptr().cast())) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `abs8`, `sign8` and `lookup16` per byte, both widths, against their scalar meaning (the
    /// 512-bit `sign8` is built from masks, there being no `vpsignb` for zmm).
    #[test]
    fn byte_ops_match_their_scalar_meaning() {
        let a: Vec<u8> = (0..64u32).map(|i| (i * 37 + 11) as u8).collect();
        let b: Vec<u8> = (0..64u32)
            .map(|i| if i % 5 == 0 { 0 } else { (i * 91 + 3) as u8 })
            .collect();
        let table: [u8; 16] = std::array::from_fn(|i| (i as u8).wrapping_mul(29) ^ 0x5A);
        let idx: Vec<u8> = (0..64u32).map(|i| (i * 7 % 16) as u8).collect();
        let sign = |x: u8, s: u8| match (s as i8).signum() {
            0 => 0,
            1 => x,
            _ => (x as i8).wrapping_neg() as u8,
        };
        let want_abs: Vec<u8> = a.iter().map(|&x| (x as i8).wrapping_abs() as u8).collect();
        let want_sign: Vec<u8> = a.iter().zip(&b).map(|(&x, &s)| sign(x, s)).collect();
        let want_lookup: Vec<u8> = idx.iter().map(|&i| table[usize::from(i)]).collect();
        let store = |v: &[u8]| v.to_vec();
        if crate::Features::get().avx2_fma_f16c() {
            // SAFETY: AVX2, FMA and F16C were detected.
            let k = unsafe { Ymm::<false>::assume() };
            let mut out = [0u8; 32];
            let run = |f: &dyn Fn(__m256i, __m256i) -> __m256i, x: &[u8], y: &[u8], out: &mut [u8; 32]| {
                let v = f(k.load(x), k.load(y));
                // SAFETY: `out` holds 32 bytes; AVX per the token.
                unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), v) };
            };
            run(&|x, _| k.abs8(x), &a, &b, &mut out);
            assert_eq!(store(&out), want_abs[..32]);
            run(&|x, y| k.sign8(x, y), &a, &b, &mut out);
            assert_eq!(store(&out), want_sign[..32]);
            run(&|_, y| k.lookup16(k.table16(&table), y), &a, &idx, &mut out);
            assert_eq!(store(&out), want_lookup[..32]);
        }
        if crate::packed_x86_wide::available() {
            // SAFETY: AVX2, FMA, F16C and AVX-512F/BW/VL/VNNI were detected.
            let k = unsafe { Zmm::<false, false>::assume() };
            let mut out = [0u8; 64];
            let run = |f: &dyn Fn(__m512i, __m512i) -> __m512i, x: &[u8], y: &[u8], out: &mut [u8; 64]| {
                let v = f(k.load(x), k.load(y));
                // SAFETY: `out` holds 64 bytes; AVX-512F per the token.
                unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), v) };
            };
            run(&|x, _| k.abs8(x), &a, &b, &mut out);
            assert_eq!(store(&out), want_abs);
            run(&|x, y| k.sign8(x, y), &a, &b, &mut out);
            assert_eq!(store(&out), want_sign);
            run(&|_, y| k.lookup16(k.table16(&table), y), &a, &idx, &mut out);
            assert_eq!(store(&out), want_lookup);
        }
    }
}
