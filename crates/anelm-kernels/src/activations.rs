//! `Activations`: activation rows converted to the dot format llama.cpp pairs with each weight
//! format (its `vec_dot_type`), so the matmul runs integer dot products per block exactly as
//! ggml's CPU path does: F32→F32, F16→F16, BF16→BF16, Q4_0/Q5_0/Q8_0→Q8_0, Q4_1→Q8_1,
//! Q4_K/Q5_K/Q6_K→Q8_K.

use crate::error::{KernelError, check_len};
use crate::format::WeightFormat;
use crate::fp16::{round_bf16, round_f16};

/// Round half to even for |v| < 2^22 (quantizer inputs are at most 127 in magnitude): adding and
/// subtracting 1.5·2^23 leaves the integer part under the default rounding mode. Same result as
/// `f32::round_ties_even` (up to the sign of zero), which without SSE4.1 compiles to a libm call in the hot path.
#[inline]
fn round_even_small(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23
    if v.abs() < 4_194_304.0 {
        (v + MAGIC) - MAGIC
    } else {
        v.round_ties_even()
    }
}

/// One Q8_0/Q8_1 block of 32 values on AVX2, the same arithmetic as the portable loop of
/// `quantize_q8` (amax, `127/amax`, one multiply, round half to even): returns `(d, Σq)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn quantize_block_avx2(src: &[f32], q: &mut [i8]) -> (f32, i32) {
    use std::arch::x86_64::*;
    assert!(src.len() == 32 && q.len() == 32);
    // SAFETY: the assertion guarantees 32 readable f32; unaligned loads.
    let v: [__m256; 4] = std::array::from_fn(|k| unsafe { _mm256_loadu_ps(src.as_ptr().add(8 * k)) });
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let m = v
        .iter()
        .fold(_mm256_setzero_ps(), |m, &x| _mm256_max_ps(m, _mm256_and_ps(x, abs)));
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    let amax = lanes.iter().fold(0.0f32, |a, &b| a.max(b));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let idv = _mm256_set1_ps(id);
    let r: [__m256i; 4] = std::array::from_fn(|k| {
        _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(v[k], idv),
        ))
    });
    // Saturating packs interleave the 128-bit halves; the dword permute restores element order.
    let packed = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
    let ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: `q` holds 32 bytes (asserted); unaligned store.
    unsafe { _mm256_storeu_si256(q.as_mut_ptr().cast(), ordered) };
    let s = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
    let mut sums = [0i32; 8];
    // SAFETY: `sums` holds 8 i32.
    unsafe { _mm256_storeu_si256(sums.as_mut_ptr().cast(), s) };
    (d, sums.iter().sum())
}

/// Q8_0/Q8_1 blocks of `x` into `q` (one per value), `d` and `bsums` (one per block), and `s`
/// (`d·Σq` per block) when it is not empty.
/// Q8_0/Q8_1 blocks per task when a long activation (a prefill chunk's) is quantised across the
/// kernel pool; shorter ones run on the caller's thread. Every block is quantised on its own,
/// so the split gives the same bytes.
const PARALLEL_Q8_BLOCKS: usize = 512;

/// Q8_K blocks per task, likewise.
const PARALLEL_Q8K_BLOCKS: usize = 64;

/// One task's share of a Q8_K quantisation: values, quants, scales, 16-value sums.
type Q8kPart<'a> = (&'a [f32], &'a mut [i8], &'a mut [f32], &'a mut [i32]);

/// One task's share of a Q8_0/Q8_1 quantisation: values, quants, scales, scaled sums, sums.
type Q8Part<'a> = (&'a [f32], &'a mut [i8], &'a mut [f32], &'a mut [f32], &'a mut [i32]);

/// [`quantize_q8_blocks`], split across the kernel pool when there are enough blocks.
fn quantize_q8_blocks_on_pool(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32], bsums: &mut [i32]) {
    let blocks = x.len() / 32;
    if blocks < 2 * PARALLEL_Q8_BLOCKS || crate::pool::global().threads() < 2 {
        return quantize_q8_blocks(x, q, d, s, bsums);
    }
    let n = blocks.div_ceil(PARALLEL_Q8_BLOCKS);
    let s_parts: Vec<&mut [f32]> = if s.is_empty() {
        (0..n).map(|_| <&mut [f32]>::default()).collect()
    } else {
        s.chunks_mut(PARALLEL_Q8_BLOCKS).collect()
    };
    let parts: Vec<std::sync::Mutex<Q8Part<'_>>> = x
        .chunks(32 * PARALLEL_Q8_BLOCKS)
        .zip(q.chunks_mut(32 * PARALLEL_Q8_BLOCKS))
        .zip(d.chunks_mut(PARALLEL_Q8_BLOCKS))
        .zip(s_parts)
        .zip(bsums.chunks_mut(PARALLEL_Q8_BLOCKS))
        .map(|((((x, q), d), s), b)| std::sync::Mutex::new((x, q, d, s, b)))
        .collect();
    crate::pool::global().run(parts.len(), &|i| {
        if let Ok(mut part) = parts[i].lock() {
            let (x, q, d, s, b) = &mut *part;
            quantize_q8_blocks(x, q, d, s, b);
        }
    });
}

fn quantize_q8_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32], bsums: &mut [i32]) {
    let with_sums = !s.is_empty();
    #[cfg(target_arch = "x86_64")]
    if wide_quantizer() {
        // The unrounded scales and sums first, then both rounded to f16 a row at a time (F16C):
        // the scalar rounding per block had been a third of the quantiser's time.
        for (b, src) in x.chunks_exact(32).enumerate() {
            // SAFETY: AVX-512 F and BW were detected at run time.
            let (db, sum) = unsafe { quantize_block_avx512(src, &mut q[32 * b..32 * b + 32]) };
            d[b] = db;
            bsums[b] = sum;
            if with_sums {
                s[b] = db * sum as f32;
            }
        }
        crate::fp16::round_f16_slice(d);
        crate::fp16::round_f16_slice(s);
        return;
    }
    for (b, src) in x.chunks_exact(32).enumerate() {
        let (db, sum) = quantize_q8_block(src, &mut q[32 * b..32 * b + 32]);
        let (rd, rs) = rounded_scales(db, sum);
        d[b] = rd;
        bsums[b] = sum;
        if with_sums {
            s[b] = rs;
        }
    }
}

/// Q8_K as ggml's reference, block by block: scale from the signed value of largest magnitude,
/// iscale = −127/max; `bsums` gets each 16 values' sum. On AVX-512 [`quantize_q8k_block_avx512`]
/// (the same bytes, tested): the portable loop's search for the largest magnitude is a serial
/// chain, and a decode step quantises ~100 vectors on the caller's thread while the pool waits.
fn quantize_q8k_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], bsums: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if wide_quantizer() {
        for (b, src) in x.chunks_exact(256).enumerate() {
            // SAFETY: AVX-512 F and BW were detected at run time.
            d[b] = unsafe {
                quantize_q8k_block_avx512(src, &mut q[256 * b..256 * b + 256], &mut bsums[16 * b..16 * b + 16])
            };
        }
        return;
    }
    quantize_q8k_blocks_portable(x, q, d, bsums)
}

/// [`quantize_q8k_blocks`] in plain Rust (every target; the reference of the AVX-512 path).
fn quantize_q8k_blocks_portable(x: &[f32], q: &mut [i8], d: &mut [f32], bsums: &mut [i32]) {
    for (b, src) in x.chunks_exact(256).enumerate() {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in src {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let q = &mut q[256 * b..256 * b + 256];
        if amax == 0.0 {
            q.fill(0);
            d[b] = 0.0;
            bsums[16 * b..16 * b + 16].fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (dst, &v) in q.iter_mut().zip(src) {
            *dst = (round_even_small(iscale * v) as i32).min(127) as i8;
        }
        for j in 0..16 {
            bsums[16 * b + j] = q[16 * j..16 * j + 16].iter().map(|&v| i32::from(v)).sum();
        }
        d[b] = 1.0 / iscale;
    }
}

/// A block's stored scale `d` and `s = d·Σq`, each rounded to f16 from the unrounded `d`.
#[inline]
fn rounded_scales(db: f32, sum: i32) -> (f32, f32) {
    (round_f16(db), round_f16(db * sum as f32))
}

/// One Q8 block of 32 values, portable: the unrounded `(d, Σq)`.
fn quantize_block_portable(src: &[f32], q: &mut [i8]) -> (f32, i32) {
    let amax = src.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let db = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (dst, &v) in q.iter_mut().zip(src) {
        let r = round_even_small(v * id) as i32;
        *dst = r.clamp(-127, 127) as i8;
        sum += r;
    }
    (db, sum)
}

/// One Q8 block of 32 values on the best path this CPU has: the unrounded `(d, Σq)` (the
/// AVX-512, AVX2 and portable blocks give the same values, tested).
fn quantize_q8_block(src: &[f32], q: &mut [i8]) -> (f32, i32) {
    #[cfg(target_arch = "x86_64")]
    if wide_quantizer() {
        // SAFETY: AVX-512 F and BW were detected at run time.
        return unsafe { quantize_block_avx512(src, q) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::vector::avx2() {
        // SAFETY: AVX2 was detected at run time.
        return unsafe { quantize_block_avx2(src, q) };
    }
    quantize_block_portable(src, q)
}

/// Whether this CPU runs [`quantize_block_avx512`] (detected once).
#[cfg(target_arch = "x86_64")]
fn wide_quantizer() -> bool {
    let f = crate::Features::get();
    f.avx512f && f.avx512bw
}

/// [`quantize_block_avx2`] on two 512-bit registers: the maximum and the sum reduce in
/// registers and the quants narrow with one saturating conversion each, instead of the
/// store-and-fold reductions and the pack/permute of the 256-bit version. The unrounded
/// `(d, Σq)`, the same values as the AVX2 and portable paths (tested).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn quantize_block_avx512(src: &[f32], q: &mut [i8]) -> (f32, i32) {
    use std::arch::x86_64::*;
    assert!(src.len() == 32 && q.len() == 32);
    // SAFETY: the assertion guarantees 32 readable f32; unaligned loads.
    let (v0, v1) = unsafe { (_mm512_loadu_ps(src.as_ptr()), _mm512_loadu_ps(src.as_ptr().add(16))) };
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    let d = amax / 127.0;
    let id = _mm512_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    // The default rounding mode (nearest, ties to even) is the portable path's rounding.
    let r0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id));
    let r1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
    // SAFETY: `q` holds 32 bytes (asserted); unaligned 16-byte stores.
    unsafe {
        _mm_storeu_si128(q.as_mut_ptr().cast(), _mm512_cvtsepi32_epi8(r0));
        _mm_storeu_si128(q.as_mut_ptr().add(16).cast(), _mm512_cvtsepi32_epi8(r1));
    }
    (d, _mm512_reduce_add_epi32(_mm512_add_epi32(r0, r1)))
}

/// One Q8_K block (256 values) on AVX-512: the portable loop's bytes, 16-value sums and scale
/// `d`, returned. The signed value of largest magnitude is the first one reaching the maximum
/// magnitude (the portable loop keeps the first on ties); `iscale · v` rounds half to even as
/// there (the default rounding mode; |iscale · v| ≤ 127 up to one rounding, so the magic-number
/// rounding gives the same integers), then `min(127)`. A block holding NaN or ±∞ goes to the
/// portable loop.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn quantize_q8k_block_avx512(src: &[f32], q: &mut [i8], bsums: &mut [i32]) -> f32 {
    use std::arch::x86_64::*;
    assert!(src.len() == 256 && q.len() == 256 && bsums.len() == 16);
    // SAFETY: the assertion guarantees 256 readable f32; unaligned loads.
    let v: [__m512; 16] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(src.as_ptr().add(16 * i)) });
    let limit = _mm512_set1_ps(f32::MAX);
    let (mut m, mut bad) = (_mm512_setzero_ps(), 0u16);
    for vi in &v {
        let a = _mm512_abs_ps(*vi);
        // NaN or ±∞: not below the largest finite value, unordered included.
        bad |= _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(a, limit);
        m = _mm512_max_ps(m, a);
    }
    if bad != 0 {
        // The portable loop's own treatment of non-finite values (rare enough to be slow).
        let mut d = 0.0;
        quantize_q8k_blocks_portable(src, q, std::slice::from_mut(&mut d), bsums);
        return d;
    }
    let amax = _mm512_reduce_max_ps(m);
    if amax == 0.0 {
        q.fill(0);
        bsums.fill(0);
        return 0.0;
    }
    // The first value whose magnitude is `amax` (one exists: every value is finite).
    let max = src.iter().copied().find(|x| x.abs() == amax).unwrap_or(amax);
    let iscale = -127.0 / max;
    let (scale, top) = (_mm512_set1_ps(iscale), _mm512_set1_epi32(127));
    for (i, vi) in v.iter().enumerate() {
        let r = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(*vi, scale)), top);
        bsums[i] = _mm512_reduce_add_epi32(r);
        // SAFETY: `q` holds 256 bytes (asserted); an unaligned 16-byte store at 16·i.
        unsafe { _mm_storeu_si128(q.as_mut_ptr().add(16 * i).cast(), _mm512_cvtsepi32_epi8(r)) };
    }
    1.0 / iscale
}

/// The activation encoding paired with a weight format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActKind {
    F32,
    F16,
    BF16,
    Q8_0,
    Q8_1,
    Q8K,
}

impl ActKind {
    pub(crate) fn for_weights(fmt: WeightFormat) -> Self {
        match fmt {
            WeightFormat::F32 => Self::F32,
            WeightFormat::F16 => Self::F16,
            WeightFormat::BF16 => Self::BF16,
            WeightFormat::Q4_0
            | WeightFormat::Q5_0
            | WeightFormat::Q8_0
            | WeightFormat::IQ4_NL
            | WeightFormat::MXFP4 => Self::Q8_0,
            WeightFormat::Q4_1 | WeightFormat::Q5_1 => Self::Q8_1,
            WeightFormat::Q4_K
            | WeightFormat::Q5_K
            | WeightFormat::Q6_K
            | WeightFormat::Q2_K
            | WeightFormat::Q3_K
            | WeightFormat::IQ4_XS => Self::Q8K,
        }
    }
}

/// `lanes` activation rows of `cols` values, quantised to the dot format paired with a weight
/// format. Reusable: `quantize` keeps its buffers, so a warm decode loop does not allocate.
#[derive(Clone, Debug, PartialEq)]
pub struct Activations {
    pub(crate) fmt: WeightFormat,
    pub(crate) kind: ActKind,
    pub(crate) lanes: usize,
    pub(crate) cols: usize,
    /// Float kinds: the (rounded) values, lane-major.
    pub(crate) f: Vec<f32>,
    /// Quantised kinds: int8 values, lane-major.
    pub(crate) q: Vec<i8>,
    /// Per block scale (f16-rounded for Q8_0/Q8_1, f32 for Q8_K), lane-major.
    pub(crate) d: Vec<f32>,
    /// Q8_1: per block s = d·Σq (f16-rounded).
    pub(crate) s: Vec<f32>,
    /// Q8_0/Q8_1: per block Σq; Q8_K: per 16 elements Σq.
    pub(crate) bsums: Vec<i32>,
    /// Q8_0: per block −128·Σq, the starting value of the 512-bit Q8_0 kernel's integer sums
    /// (its weights are stored as `w + 128`), loaded with the broadcast instead of computed
    /// per (lane, block) on the vector ports.
    pub(crate) neg_offsets: Vec<i32>,
    /// Q4_0/Q5_0: per 4 values −8·Σq (Q4_0) or −16·Σq (Q5_0), the starting value of the packed
    /// kernels' integer sums of 4 products (their weights are stored unsigned, without the
    /// format's offset of 8 or 16), so each 4-product partial sum comes out exact.
    pub(crate) quad_offsets: Vec<i32>,
    /// Q4_K: per pair of 32-value sub-blocks `(Σq of the first, Σq of the second)` as two i16
    /// in one i32, the operand of the packed kernel's `madd` against a pair of minimums.
    pub(crate) kpairs: Vec<i32>,
    /// Q6_K: per 16 values −32·Σq, the starting value of the packed kernel's sub-block sums
    /// (its weights are read unsigned, without the format's offset of 32).
    pub(crate) sub_offsets: Vec<i32>,
}

impl Default for Activations {
    fn default() -> Self {
        Self::new()
    }
}

impl Activations {
    /// Empty buffers.
    pub fn new() -> Self {
        Self {
            fmt: WeightFormat::F32,
            kind: ActKind::F32,
            lanes: 0,
            cols: 0,
            f: Vec::new(),
            q: Vec::new(),
            d: Vec::new(),
            s: Vec::new(),
            bsums: Vec::new(),
            neg_offsets: Vec::new(),
            quad_offsets: Vec::new(),
            kpairs: Vec::new(),
            sub_offsets: Vec::new(),
        }
    }

    /// Lanes held.
    pub fn lanes(&self) -> usize {
        self.lanes
    }

    /// Columns per lane.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The weight format these were quantised for.
    pub fn weight_format(&self) -> WeightFormat {
        self.fmt
    }

    /// Whether these activations serve matrices stored in `fmt` (see
    /// [`WeightFormat::shares_activations`]).
    pub fn pairs_with(&self, fmt: WeightFormat) -> bool {
        self.fmt.shares_activations(fmt)
    }

    /// Convert `x` (lane-major: `x[lane*cols + k]`) for weights stored in `weight_fmt`.
    pub fn quantize(
        &mut self,
        weight_fmt: WeightFormat,
        x: &[f32],
        lanes: usize,
        cols: usize,
    ) -> Result<(), KernelError> {
        check_len(
            "activations",
            lanes.checked_mul(cols).ok_or(KernelError::Overflow)?,
            x.len(),
            "values",
        )?;
        weight_fmt.row_bytes(cols)?;
        self.fmt = weight_fmt;
        self.kind = ActKind::for_weights(weight_fmt);
        self.lanes = lanes;
        self.cols = cols;
        match self.kind {
            ActKind::F32 => {
                self.f.clear();
                self.f.extend_from_slice(x);
            }
            ActKind::F16 => {
                self.f.clear();
                self.f.extend(x.iter().map(|&v| round_f16(v)));
            }
            ActKind::BF16 => {
                self.f.clear();
                self.f.extend(x.iter().map(|&v| round_bf16(v)));
            }
            ActKind::Q8_0 | ActKind::Q8_1 => self.quantize_q8(x, self.kind == ActKind::Q8_1),
            ActKind::Q8K => self.quantize_q8k(x),
        }
        Ok(())
    }

    /// Size the buffers for `lanes × cols` values for `weight_fmt` and hand out a writer that
    /// fills them a 32-value block at a time, from several threads at once (each block written
    /// by one): the producers of a matmul's output quantise it for the next matmul as they go.
    /// `None` when the paired encoding is not Q8_0/Q8_1 (those quantise whole rows).
    pub fn block_writer(
        &mut self,
        weight_fmt: WeightFormat,
        lanes: usize,
        cols: usize,
    ) -> Result<Option<BlockWriter<'_>>, KernelError> {
        weight_fmt.row_bytes(cols)?;
        let kind = ActKind::for_weights(weight_fmt);
        if !matches!(kind, ActKind::Q8_0 | ActKind::Q8_1) || !cols.is_multiple_of(32) {
            return Ok(None);
        }
        let values = lanes.checked_mul(cols).ok_or(KernelError::Overflow)?;
        let blocks = values / 32;
        let with_sums = kind == ActKind::Q8_1;
        self.fmt = weight_fmt;
        self.kind = kind;
        self.lanes = lanes;
        self.cols = cols;
        self.q.resize(values, 0);
        self.d.resize(blocks, 0.0);
        self.s.resize(if with_sums { blocks } else { 0 }, 0.0);
        self.bsums.resize(blocks, 0);
        self.neg_offsets.resize(if with_sums { 0 } else { blocks }, 0);
        let quad_mul = quad_offset(weight_fmt);
        self.quad_offsets
            .resize(if quad_mul.is_some() { 8 * blocks } else { 0 }, 0);
        Ok(Some(BlockWriter {
            q: self.q.as_mut_ptr(),
            d: self.d.as_mut_ptr(),
            s: if with_sums {
                self.s.as_mut_ptr()
            } else {
                std::ptr::null_mut()
            },
            bsums: self.bsums.as_mut_ptr(),
            neg: if with_sums {
                std::ptr::null_mut()
            } else {
                self.neg_offsets.as_mut_ptr()
            },
            quad: if quad_mul.is_some() {
                self.quad_offsets.as_mut_ptr()
            } else {
                std::ptr::null_mut()
            },
            quad_mul: quad_mul.unwrap_or(0),
            blocks,
            _held: std::marker::PhantomData,
        }))
    }

    /// Q8_0/Q8_1 as ggml's x86 path does it: d = amax/127 (stored f16), q = round-half-even(x·127/amax).
    fn quantize_q8(&mut self, x: &[f32], with_sums: bool) {
        let blocks = x.len() / 32;
        self.q.resize(x.len(), 0);
        self.d.resize(blocks, 0.0);
        self.s.resize(if with_sums { blocks } else { 0 }, 0.0);
        self.bsums.resize(blocks, 0);
        quantize_q8_blocks_on_pool(x, &mut self.q, &mut self.d, &mut self.s, &mut self.bsums);
        self.neg_offsets.clear();
        if !with_sums {
            // |Σq| ≤ 32 · 127, so −128·Σq fits an i32 with room to spare.
            self.neg_offsets.extend(self.bsums.iter().map(|&v| -128 * v));
        }
        self.quad_offsets.clear();
        if let Some(m) = quad_offset(self.fmt) {
            self.quad_offsets
                .extend(self.q.chunks_exact(4).map(|c| m * quad_sum(c)));
        }
    }

    /// Q8_K as ggml's reference: scale from the signed value of largest magnitude, iscale = −127/max.
    fn quantize_q8k(&mut self, x: &[f32]) {
        let blocks = x.len() / 256;
        self.q.resize(x.len(), 0);
        self.d.resize(blocks, 0.0);
        self.bsums.resize(blocks * 16, 0);
        let (q, d, bsums) = (&mut self.q, &mut self.d, &mut self.bsums);
        if blocks >= 2 * PARALLEL_Q8K_BLOCKS && crate::pool::global().threads() > 1 {
            let parts: Vec<std::sync::Mutex<Q8kPart<'_>>> = x
                .chunks(256 * PARALLEL_Q8K_BLOCKS)
                .zip(q.chunks_mut(256 * PARALLEL_Q8K_BLOCKS))
                .zip(d.chunks_mut(PARALLEL_Q8K_BLOCKS))
                .zip(bsums.chunks_mut(16 * PARALLEL_Q8K_BLOCKS))
                .map(|(((x, q), d), b)| std::sync::Mutex::new((x, q, d, b)))
                .collect();
            crate::pool::global().run(parts.len(), &|i| {
                if let Ok(mut part) = parts[i].lock() {
                    let (x, q, d, b) = &mut *part;
                    quantize_q8k_blocks(x, q, d, b);
                }
            });
        } else {
            quantize_q8k_blocks(x, q, d, bsums);
        }
        self.kpairs.clear();
        self.sub_offsets.clear();
        // Both derived sums, whichever K-quant asked: the same activations then serve Q4_K,
        // Q5_K and Q6_K matrices alike (a Q4_K_M layer's Q6_K and Q4_K projections in one loop).
        self.kpairs.extend(self.bsums.chunks_exact(4).map(|s| {
            // Each 32-value sum is within ±32·127, so it fits an i16.
            let (a, b) = (s[0] + s[1], s[2] + s[3]);
            (a & 0xFFFF) | (b << 16)
        }));
        self.sub_offsets.extend(self.bsums.iter().map(|&v| -32 * v));
    }
}

/// The multiplier of a 4-value sum in [`Activations::quad_offsets`] for weights in `fmt`
/// (minus the offset its packed kernel leaves in the weights), or `None` if it has none.
fn quad_offset(fmt: WeightFormat) -> Option<i32> {
    match fmt {
        WeightFormat::Q4_0 => Some(-8),
        WeightFormat::Q5_0 => Some(-16),
        // The VNNI kernels read IQ4_NL's levels as unsigned `level + 128`.
        WeightFormat::IQ4_NL => Some(-128),
        _ => None,
    }
}

/// The sum of 4 quants.
#[inline]
fn quad_sum(q: &[i8]) -> i32 {
    q.iter().map(|&v| i32::from(v)).sum()
}

/// Fills an [`Activations`] block by block (see [`Activations::block_writer`]); holds it
/// mutably borrowed until dropped.
pub struct BlockWriter<'a> {
    q: *mut i8,
    d: *mut f32,
    /// Null for Q8_0.
    s: *mut f32,
    bsums: *mut i32,
    /// Null for Q8_1.
    neg: *mut i32,
    /// 8 per block, for Q4_0/Q5_0; null otherwise.
    quad: *mut i32,
    /// Its multiplier (see [`quad_offset`]).
    quad_mul: i32,
    blocks: usize,
    _held: std::marker::PhantomData<&'a mut Activations>,
}

// SAFETY: the pointers address the borrowed `Activations`' buffers, alive while `'a` lasts;
// `write` touches only one block's entries, and its contract makes each block single-writer.
unsafe impl Sync for BlockWriter<'_> {}

impl BlockWriter<'_> {
    /// Quantise `src` (32 values) as block `block` (lane-major: `lane · cols / 32 + k`), with
    /// exactly the arithmetic of [`Activations::quantize`].
    ///
    /// # Safety
    /// No other thread may write or read block `block` during the call.
    pub unsafe fn write(&self, block: usize, src: &[f32]) {
        assert!(
            block < self.blocks && src.len() == 32,
            "block {block} of {}",
            self.blocks
        );
        // SAFETY: `block < blocks`, so these 32 quants lie inside the buffer; the caller makes
        // this block single-writer.
        let q = unsafe { std::slice::from_raw_parts_mut(self.q.add(32 * block), 32) };
        let (db, sum) = quantize_q8_block(src, q);
        let (rd, rs) = rounded_scales(db, sum);
        // SAFETY: as above, one entry per block in each per-block buffer (null ones skipped).
        unsafe {
            *self.d.add(block) = rd;
            *self.bsums.add(block) = sum;
            if !self.s.is_null() {
                *self.s.add(block) = rs;
            }
            if !self.neg.is_null() {
                *self.neg.add(block) = -128 * sum;
            }
            if !self.quad.is_null() {
                for (k, c) in q.chunks_exact(4).enumerate() {
                    *self.quad.add(8 * block + k) = self.quad_mul * quad_sum(c);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::round_even_small;

    /// The Q8_K quantiser on this CPU's best path gives the portable loop's bytes, sums and
    /// scales: random blocks at several magnitudes, ties for the largest magnitude (either sign
    /// first), exact halves after scaling, zero blocks, and NaN / ±∞ (the portable fallback).
    /// Where the CPU lacks AVX-512 both sides are the portable loop and this checks nothing.
    #[test]
    fn q8k_blocks_equal_the_portable_loop() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let mut blocks: Vec<Vec<f32>> = Vec::new();
        for scale in [1e-30f32, 1e-3, 1.0, 3.7, 1e4, 1e30] {
            blocks.push((0..256).map(|_| next() * scale).collect());
        }
        let mut tie: Vec<f32> = (0..256).map(|_| next()).collect();
        (tie[10], tie[200]) = (-2.0, 2.0);
        blocks.push(tie.clone());
        (tie[10], tie[200]) = (2.0, -2.0);
        blocks.push(tie);
        // Largest magnitude −127 first, so iscale is exactly 1 and every other value, k + ½,
        // is an exact half after scaling: ties to even must agree, upwards and downwards.
        blocks.push(
            (0..256)
                .map(|i| if i == 0 { -127.0 } else { (i % 254) as f32 - 126.5 })
                .collect(),
        );
        blocks.push(vec![0.0; 256]);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut b: Vec<f32> = (0..256).map(|_| next()).collect();
            b[77] = bad;
            blocks.push(b);
        }
        let x: Vec<f32> = blocks.concat();
        let n = x.len() / 256;
        let (mut q, mut d, mut s) = (vec![0i8; x.len()], vec![0f32; n], vec![0i32; 16 * n]);
        let (mut q2, mut d2, mut s2) = (q.clone(), d.clone(), s.clone());
        super::quantize_q8k_blocks(&x, &mut q, &mut d, &mut s);
        super::quantize_q8k_blocks_portable(&x, &mut q2, &mut d2, &mut s2);
        assert_eq!(q, q2);
        assert_eq!(s, s2);
        for (a, b) in d.iter().zip(&d2) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
    }

    #[test]
    fn magic_rounding_equals_round_ties_even() {
        let mut v = -200.0f32;
        while v <= 200.0 {
            for x in [v, v + 0.5, -(v + 0.5), v + 0.4999999, v + 0.5000001] {
                assert_eq!(round_even_small(x) as i32, x.round_ties_even() as i32, "{x}");
            }
            v += 0.37;
        }
        assert_eq!(round_even_small(2.5), 2.0);
        assert_eq!(round_even_small(-3.5), -4.0);
        assert_eq!(round_even_small(1e9), 1e9);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_block_quantizer_equals_the_portable_one() {
        if !crate::vector::avx2() {
            return;
        }
        let mut seed = 17u64;
        for block in 0..2000 {
            let scale = [1e-3f32, 0.7, 3.0, 250.0][block % 4];
            let src: Vec<f32> = (0..32)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let v = ((seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale;
                    // Exact ties and zero blocks too.
                    if block % 7 == 0 {
                        (v * 4.0).round() / 4.0
                    } else if block % 11 == 0 {
                        0.0
                    } else {
                        v
                    }
                })
                .collect();
            let amax = src.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let want: Vec<i8> = src
                .iter()
                .map(|&v| (round_even_small(v * id) as i32).clamp(-127, 127) as i8)
                .collect();
            let want_sum: i32 = src.iter().map(|&v| round_even_small(v * id) as i32).sum();
            let mut q = [0i8; 32];
            // SAFETY: AVX2 was detected above.
            let (d, sum) = unsafe { super::quantize_block_avx2(&src, &mut q) };
            assert_eq!(q.to_vec(), want, "block {block}");
            assert_eq!(sum, want_sum, "block {block}");
            assert_eq!(d.to_bits(), (amax / 127.0).to_bits());
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_block_quantizer_equals_the_avx2_one() {
        if !super::wide_quantizer() {
            eprintln!("skipped: this CPU has no AVX-512 (the dispatch never takes this path)");
            return;
        }
        let mut seed = 23u64;
        for block in 0..5000 {
            let scale = [1e-6f32, 1e-3, 0.7, 3.0, 250.0, 6e4][block % 6];
            let src: Vec<f32> = (0..32)
                .map(|i| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let v = ((seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale;
                    match block % 13 {
                        0 => (v * 4.0).round() / 4.0, // exact ties after scaling are common
                        1 => 0.0,
                        2 if i == 5 => -scale, // the largest magnitude negative
                        _ => v,
                    }
                })
                .collect();
            let (mut q2, mut q5) = ([0i8; 32], [0i8; 32]);
            // SAFETY: AVX-512 F/BW detected above; AVX2 comes with them.
            let (a, b) = unsafe {
                (
                    super::quantize_block_avx2(&src, &mut q2),
                    super::quantize_block_avx512(&src, &mut q5),
                )
            };
            assert_eq!(q5, q2, "block {block}");
            assert_eq!(b.1, a.1, "block {block}");
            assert_eq!(b.0.to_bits(), a.0.to_bits(), "block {block}");
        }
    }

    /// `lanes × cols` values in [−3, 3) from `seed`, and their activations for `fmt`.
    fn quantised_batch(
        seed: &mut u64,
        fmt: crate::format::WeightFormat,
        lanes: usize,
        cols: usize,
    ) -> (Vec<f32>, super::Activations) {
        let x: Vec<f32> = (0..lanes * cols)
            .map(|_| {
                *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (*seed >> 40) as f32 / (1u64 << 24) as f32 * 6.0 - 3.0
            })
            .collect();
        let mut all = super::Activations::new();
        all.quantize(fmt, &x, lanes, cols).expect("quantize");
        (x, all)
    }

    #[test]
    fn lanes_quantised_together_equal_each_lane_alone() {
        // Each lane of a batch comes out as it does on its own (Q8_0 and Q8_1, decode- and
        // prefill-sized batches): no block reads across a lane's end.
        use super::Activations;
        use crate::format::WeightFormat;
        let mut seed = 5u64;
        for (fmt, lanes, cols) in [
            (WeightFormat::Q4_1, 4, 576),
            (WeightFormat::Q8_0, 3, 1536),
            (WeightFormat::Q4_1, 37, 64),
            // Prefill-sized: split across the kernel pool (≥ 2 × PARALLEL_Q8_BLOCKS blocks).
            (WeightFormat::Q8_0, 64, 1024),
            (WeightFormat::Q4_1, 40, 1024),
        ] {
            let (x, all) = quantised_batch(&mut seed, fmt, lanes, cols);
            let nb = cols / 32;
            for l in 0..lanes {
                let mut one = Activations::new();
                one.quantize(fmt, &x[l * cols..(l + 1) * cols], 1, cols)
                    .expect("quantize");
                assert_eq!(all.q[l * cols..(l + 1) * cols], one.q[..], "{fmt:?} lane {l}");
                assert_eq!(all.bsums[l * nb..(l + 1) * nb], one.bsums[..], "{fmt:?} lane {l}");
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&all.d[l * nb..(l + 1) * nb]), bits(&one.d), "{fmt:?} lane {l}");
                if fmt == WeightFormat::Q4_1 {
                    assert_eq!(bits(&all.s[l * nb..(l + 1) * nb]), bits(&one.s), "{fmt:?} lane {l}");
                } else {
                    assert!(all.s.is_empty());
                }
            }
        }
    }

    #[test]
    fn q8k_lanes_quantised_together_equal_each_lane_alone() {
        // Q8_K (K-quant weights), decode-sized and split across the kernel pool
        // (≥ 2 × PARALLEL_Q8K_BLOCKS blocks): each lane as on its own, bit for bit.
        use super::Activations;
        use crate::format::WeightFormat;
        let mut seed = 11u64;
        for (fmt, lanes, cols) in [
            (WeightFormat::Q4_K, 2, 512),
            (WeightFormat::Q4_K, 64, 1024),
            (WeightFormat::Q6_K, 33, 2048),
        ] {
            let (x, all) = quantised_batch(&mut seed, fmt, lanes, cols);
            let nb = cols / 256;
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            for l in 0..lanes {
                let mut one = Activations::new();
                one.quantize(fmt, &x[l * cols..(l + 1) * cols], 1, cols)
                    .expect("quantize");
                assert_eq!(all.q[l * cols..(l + 1) * cols], one.q[..], "{fmt:?} lane {l}");
                assert_eq!(
                    all.bsums[16 * l * nb..16 * (l + 1) * nb],
                    one.bsums[..],
                    "{fmt:?} lane {l}"
                );
                assert_eq!(bits(&all.d[l * nb..(l + 1) * nb]), bits(&one.d), "{fmt:?} lane {l}");
            }
        }
    }
}
