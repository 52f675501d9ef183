//! AVX2 inner loops of the matmul. Block integer dots use `maddubs`/`madd`. Q8_0/Q8_1-paired
//! formats then accumulate blocks in eight f32 lanes with FMA and reduce once per row, as
//! llama.cpp's AVX2 path does (no horizontal sum per block); the K-quants reduce each super-block
//! exactly and accumulate as the scalar path does. Results differ from scalar only by f32
//! summation order.

use std::arch::x86_64::*;

use crate::activations::{ActKind, Activations};
use crate::blocks::{unpack_q4_k, unpack_q5_k, unpack_q6_k};
use crate::format::WeightFormat;
use crate::fp16::{bf16_to_f32, f16_to_f32};

/// Whether this CPU runs the AVX2 path (AVX2, FMA and F16C).
pub(crate) fn available() -> bool {
    crate::Features::get().avx2_fma_f16c()
}

#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn load256(b: &[u8]) -> __m256i {
    assert!(b.len() >= 32);
    // SAFETY: the assertion guarantees 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn load256_i8(b: &[i8]) -> __m256i {
    assert!(b.len() >= 32);
    // SAFETY: as in `load256`.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn load128(b: &[u8]) -> __m128i {
    assert!(b.len() >= 16);
    // SAFETY: the assertion guarantees 16 readable bytes; loadu has no alignment requirement.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

#[inline]
#[target_feature(enable = "avx2")]
fn hsum_f32(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The f16 at byte `at` of `b`, converted by F16C (no table lookup in the hot loop).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn f16c_at(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The two f16 at bytes 0..4 of `b` (a block's d and m).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn f16c_pair(b: &[u8]) -> (f32, f32) {
    let bits = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// 8 partial sums of u8 × i8 products (each 4 adjacent elements); exact (no saturation for
/// weights ≤ 128 and activations in −127..=127).
#[inline]
#[target_feature(enable = "avx2")]
fn dot_u8_i8(w: __m256i, x: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
}

/// As `dot_u8_i8` for signed weights (sign moved onto the activations).
#[inline]
#[target_feature(enable = "avx2")]
fn dot_i8_i8(w: __m256i, x: __m256i) -> __m256i {
    dot_u8_i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
}

/// 32 nibbles of a 16-byte block: low nibbles first, then high, as u8 0..16.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles(qs: &[u8]) -> __m256i {
    let v = load128(qs);
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(v, m);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), m);
    _mm256_set_m128i(hi, lo)
}

/// The 32 signed weights of a Q5_0 block (`{f16 d; u32 qh; u8 qs[16]}`), -16..16: weight `p` is
/// nibble `p` of `qs` (low nibbles first) with bit `p` of `qh` as its fifth bit, minus 16. The
/// fifth bits are spread one per byte by a byte shuffle and a bit-mask compare.
#[inline]
#[target_feature(enable = "avx2")]
fn q5_0_weights(b: &[u8]) -> __m256i {
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    // Byte p of `spread` is byte p/8 of qh (the shuffle indexes within each 128-bit half, and
    // both halves hold all four bytes of qh).
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(qh as i32),
        _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202, 0x0303_0303_0303_0303),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    let high = _mm256_and_si256(set, _mm256_set1_epi8(0x10));
    _mm256_sub_epi8(_mm256_or_si256(nibbles(&b[6..22]), high), _mm256_set1_epi8(16))
}

/// The 32 unsigned weights of a Q5_1 block (`{f16 d; f16 m; u32 qh; u8 qs[16]}`), 0..32: the
/// bit layout of Q5_0 two bytes further on, without its offset.
#[inline]
#[target_feature(enable = "avx2")]
fn q5_1_weights(b: &[u8]) -> __m256i {
    _mm256_add_epi8(q5_0_weights(&b[2..]), _mm256_set1_epi8(16))
}

/// The 32 signed weights of an IQ4_NL block's 16 index bytes (low nibbles first): one byte
/// shuffle looks every index up in ggml's 16-entry table (held in both 128-bit halves).
#[inline]
#[target_feature(enable = "avx2")]
fn iq4_nl_weights(qs: &[u8]) -> __m256i {
    table_weights(&crate::blocks::IQ4_NL_VALUES, qs)
}

/// The 32 values of a 16-byte block of 4-bit indices into `levels`.
#[inline]
#[target_feature(enable = "avx2")]
fn table_weights(levels: &[i8; 16], qs: &[u8]) -> __m256i {
    let t = levels.map(|v| v as u8);
    let table = load128(&t);
    _mm256_shuffle_epi8(_mm256_set_m128i(table, table), nibbles(qs))
}

/// acc[l] += W_row · x[lane0 + l]; the AVX2 twin of `matmul::dot_row`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_row(fmt: WeightFormat, row: &[u8], x: &Activations, lane0: usize, acc: &mut [f32]) {
    let cols = x.cols;
    let bb = fmt.block_bytes();
    match x.kind {
        ActKind::F32 | ActKind::F16 | ActKind::BF16 => float_row(fmt, row, x, lane0, acc),
        ActKind::Q8_0 => {
            let nb = cols / 32;
            for (l, a) in acc.iter_mut().enumerate() {
                let xq = &x.q[32 * nb * (lane0 + l)..32 * nb * (lane0 + l + 1)];
                let xd = &x.d[nb * (lane0 + l)..nb * (lane0 + l + 1)];
                let mut sum = _mm256_setzero_ps();
                for ((b, xb), &dx) in row.chunks_exact(bb).zip(xq.chunks_exact(32)).zip(xd) {
                    let (w, dw) = match fmt {
                        WeightFormat::Q8_0 => (load256(&b[2..34]), f16c_at(b, 0)),
                        WeightFormat::Q4_0 => (_mm256_sub_epi8(nibbles(&b[2..18]), _mm256_set1_epi8(8)), f16c_at(b, 0)),
                        WeightFormat::IQ4_NL => (iq4_nl_weights(&b[2..18]), f16c_at(b, 0)),
                        WeightFormat::MXFP4 => (
                            table_weights(&crate::blocks::MXFP4_VALUES, &b[1..17]),
                            crate::blocks::e8m0_half(b[0]),
                        ),
                        _ => (q5_0_weights(b), f16c_at(b, 0)),
                    };
                    let p = _mm256_cvtepi32_ps(dot_i8_i8(w, load256_i8(xb)));
                    sum = _mm256_fmadd_ps(p, _mm256_set1_ps(dw * dx), sum);
                }
                *a += hsum_f32(sum);
            }
        }
        ActKind::Q8_1 => {
            let nb = cols / 32;
            for (l, a) in acc.iter_mut().enumerate() {
                let xq = &x.q[32 * nb * (lane0 + l)..32 * nb * (lane0 + l + 1)];
                let xd = &x.d[nb * (lane0 + l)..nb * (lane0 + l + 1)];
                let xs = &x.s[nb * (lane0 + l)..nb * (lane0 + l + 1)];
                let mut sum = _mm256_setzero_ps();
                let mut mins = 0.0f32;
                for (((b, xb), &dx), &sx) in row.chunks_exact(bb).zip(xq.chunks_exact(32)).zip(xd).zip(xs) {
                    let (dw, mw) = f16c_pair(b);
                    let w = if fmt == WeightFormat::Q5_1 {
                        q5_1_weights(b)
                    } else {
                        nibbles(&b[4..20])
                    };
                    let p = _mm256_cvtepi32_ps(dot_u8_i8(w, load256_i8(xb)));
                    sum = _mm256_fmadd_ps(p, _mm256_set1_ps(dw * dx), sum);
                    mins += mw * sx;
                }
                *a += hsum_f32(sum) + mins;
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
                        let mut sumv = _mm256_setzero_si256();
                        let mut summins = 0i32;
                        for j in 0..8 {
                            let p = dot_u8_i8(load256_i8(&q[32 * j..]), load256_i8(&xq[32 * j..]));
                            sumv = _mm256_add_epi32(sumv, _mm256_mullo_epi32(p, _mm256_set1_epi32(i32::from(sc[j]))));
                            summins += i32::from(mn[j]) * (bs[2 * j] + bs[2 * j + 1]);
                        }
                        let sumi = hsum_i32(sumv);
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
                        let mut sumv = _mm256_setzero_si256();
                        for j in 0..8 {
                            // Two 16-element sub-blocks: i32 lanes 0..4 are sub-block 2j, 4..8 are 2j+1.
                            let p = dot_i8_i8(load256_i8(&q[32 * j..]), load256_i8(&xq[32 * j..]));
                            let s0 = i32::from(sc[2 * j]);
                            let s1 = i32::from(sc[2 * j + 1]);
                            let scale = _mm256_setr_epi32(s0, s0, s0, s0, s1, s1, s1, s1);
                            sumv = _mm256_add_epi32(sumv, _mm256_mullo_epi32(p, scale));
                        }
                        *a += d * x.d[blk] * hsum_i32(sumv) as f32;
                    }
                }
            }
        }
    }
}

/// Eight weights of a float row as f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn load_w8(fmt: WeightFormat, row: &[u8], k: usize) -> __m256 {
    match fmt {
        WeightFormat::F32 => {
            let b = &row[4 * k..4 * k + 32];
            // SAFETY: `b` holds exactly 32 bytes = 8 f32; loadu has no alignment requirement.
            unsafe { _mm256_loadu_ps(b.as_ptr().cast()) }
        }
        WeightFormat::F16 => _mm256_cvtph_ps(load128(&row[2 * k..2 * k + 16])),
        _ => {
            let h = _mm256_cvtepu16_epi32(load128(&row[2 * k..2 * k + 16]));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
        }
    }
}

/// `s` plus the scalar products of columns `from .. cols` (the tail a vector loop leaves), added
/// in column order.
#[inline]
fn add_tail(mut s: f32, fmt: WeightFormat, row: &[u8], xs: &[f32], from: usize, cols: usize) -> f32 {
    for (kk, &xv) in xs.iter().enumerate().take(cols).skip(from) {
        s += scalar_w(fmt, row, kk) * xv;
    }
    s
}

#[inline]
fn scalar_w(fmt: WeightFormat, row: &[u8], k: usize) -> f32 {
    match fmt {
        WeightFormat::F32 => f32::from_le_bytes([row[4 * k], row[4 * k + 1], row[4 * k + 2], row[4 * k + 3]]),
        WeightFormat::F16 => f16_to_f32(u16::from_le_bytes([row[2 * k], row[2 * k + 1]])),
        _ => bf16_to_f32(u16::from_le_bytes([row[2 * k], row[2 * k + 1]])),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn float_row(fmt: WeightFormat, row: &[u8], x: &Activations, lane0: usize, acc: &mut [f32]) {
    let cols = x.cols;
    let main = cols - cols % 8;
    for (l, a) in acc.iter_mut().enumerate() {
        let xs = &x.f[(lane0 + l) * cols..(lane0 + l + 1) * cols];
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut k = 0;
        while k + 16 <= main {
            // SAFETY: k + 16 <= cols, so both 8-float loads stay inside `xs`.
            let (x0, x1) = unsafe {
                (
                    _mm256_loadu_ps(xs.as_ptr().add(k)),
                    _mm256_loadu_ps(xs.as_ptr().add(k + 8)),
                )
            };
            s0 = _mm256_fmadd_ps(load_w8(fmt, row, k), x0, s0);
            s1 = _mm256_fmadd_ps(load_w8(fmt, row, k + 8), x1, s1);
            k += 16;
        }
        if k < main {
            // SAFETY: k + 8 <= main <= cols.
            let x0 = unsafe { _mm256_loadu_ps(xs.as_ptr().add(k)) };
            s0 = _mm256_fmadd_ps(load_w8(fmt, row, k), x0, s0);
            k += 8;
        }
        *a += add_tail(hsum_f32(_mm256_add_ps(s0, s1)), fmt, row, xs, k, cols);
    }
}

/// Float weights (F32, F16 or BF16): [`TILE_ROWS`] rows × `tile.len()` lanes, two lanes at a
/// time in eight accumulators, so each weight vector loaded (and, for F16/BF16, converted) serves
/// two lanes and each activation vector four rows (the per-lane [`float_row`] loads and converts
/// one weight vector per FMA, which holds a many-lane matmul such as a prefill or an encoder to a
/// fraction of the FMA rate). Each (row, lane) sum runs in the same order whatever the lane
/// count, so a lane's result does not depend on its batch.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `fmt` is F32, F16 or BF16; every row holds `x.cols`
/// values, and `x` holds lanes `lane0 .. lane0 + tile.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_rows4_float(
    fmt: WeightFormat,
    rows: [&[u8]; TILE_ROWS],
    x: &Activations,
    lane0: usize,
    tile: &mut [[f32; TILE_ROWS]],
) {
    debug_assert!(matches!(
        fmt,
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16
    ));
    if has_avx512f() {
        // SAFETY: AVX-512F was detected; the caller guarantees the row and lane extents.
        unsafe { dot_rows4_float_512(fmt, rows, x, lane0, tile) };
        return;
    }
    let cols = x.cols;
    let lane = |l: usize| &x.f[(lane0 + l) * cols..(lane0 + l + 1) * cols];
    let mut l = 0;
    while l + 2 <= tile.len() {
        let sums = float_tile::<2>(fmt, rows, [lane(l), lane(l + 1)], cols);
        tile[l..l + 2].copy_from_slice(&sums);
        l += 2;
    }
    if l < tile.len() {
        // One lane (decode): row after row, so the weights stream in order.
        for (r, row) in rows.into_iter().enumerate() {
            tile[l][r] = float_tile_rows(fmt, row, lane(l), cols);
        }
    }
}

/// Σ_k w[k]·x[k] for one row and one lane in the same order as [`float_tile`]'s sums.
#[target_feature(enable = "avx2,fma,f16c")]
fn float_tile_rows(fmt: WeightFormat, w: &[u8], xs: &[f32], cols: usize) -> f32 {
    let main = cols - cols % 8;
    let mut acc = _mm256_setzero_ps();
    let mut k = 0;
    while k < main {
        let xk = &xs[k..k + 8];
        // SAFETY: `xk` holds exactly 8 f32; loadu has no alignment requirement.
        let xv = unsafe { _mm256_loadu_ps(xk.as_ptr()) };
        acc = _mm256_fmadd_ps(load_w8(fmt, w, k), xv, acc);
        k += 8;
    }
    add_tail(hsum_f32(acc), fmt, w, xs, main, cols)
}

/// Whether this CPU has AVX-512F (detected once).
fn has_avx512f() -> bool {
    crate::Features::get().avx512f
}

/// [`dot_rows4_float`] with 512-bit vectors: 4 rows × 4 lanes in sixteen accumulators (AVX-512
/// has 32 vector registers), each weight load serving four lanes.
///
/// # Safety
/// The CPU must have AVX-512F; as [`dot_rows4_float`] otherwise.
#[target_feature(enable = "avx512f")]
unsafe fn dot_rows4_float_512(
    fmt: WeightFormat,
    rows: [&[u8]; TILE_ROWS],
    x: &Activations,
    lane0: usize,
    tile: &mut [[f32; TILE_ROWS]],
) {
    let cols = x.cols;
    let lane = |l: usize| &x.f[(lane0 + l) * cols..(lane0 + l + 1) * cols];
    let mut l = 0;
    // The tiles compiled once per stored kind: the run-time format test per vector and the row
    // bounds checks had been most of the loop's instructions (F16 pp128 +30 %). The lone lane
    // (decode) keeps its run-time-format loop: specialised the same way, it streamed at half
    // the speed (field guide, 2026-12-07).
    macro_rules! tile_of {
        ($l:literal, $xs:expr) => {
            match fmt {
                WeightFormat::F32 => float_tile_512::<$l, KIND_F32>(rows, $xs, cols),
                WeightFormat::F16 => float_tile_512::<$l, KIND_F16>(rows, $xs, cols),
                _ => float_tile_512::<$l, KIND_BF16>(rows, $xs, cols),
            }
        };
    }
    while l + 4 <= tile.len() {
        let sums = tile_of!(4, std::array::from_fn(|j| lane(l + j)));
        tile[l..l + 4].copy_from_slice(&sums);
        l += 4;
    }
    // One to three lanes left (decode is one): only their sums, so a lone lane costs a quarter
    // of the FMAs of a full tile.
    match tile.len() - l {
        3 => tile[l..].copy_from_slice(&tile_of!(3, [lane(l), lane(l + 1), lane(l + 2)])),
        2 => tile[l..].copy_from_slice(&tile_of!(2, [lane(l), lane(l + 1)])),
        1 => {
            for (r, row) in rows.into_iter().enumerate() {
                tile[l][r] = float_tile_512_rows::<1>(fmt, [row], lane(l), cols)[0];
            }
        }
        _ => {}
    }
}

/// Bytes ahead of the tile kernels' position in each row that they ask the prefetcher for.
const PREFETCH_AHEAD: usize = 1024;

/// Sixteen weights of a float row as f32 (512-bit).
#[inline]
#[target_feature(enable = "avx512f")]
fn load_w16(fmt: WeightFormat, row: &[u8], k: usize) -> __m512 {
    match fmt {
        WeightFormat::F32 => {
            let b = &row[4 * k..4 * k + 64];
            // SAFETY: `b` holds exactly 64 bytes = 16 f32; loadu has no alignment requirement.
            unsafe { _mm512_loadu_ps(b.as_ptr().cast()) }
        }
        _ => {
            let b = &row[2 * k..2 * k + 32];
            // SAFETY: `b` holds exactly 32 bytes = 16 halves; loadu has no alignment requirement.
            let h = unsafe { _mm256_loadu_si256(b.as_ptr().cast()) };
            if fmt == WeightFormat::F16 {
                _mm512_cvtph_ps(h)
            } else {
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            }
        }
    }
}

/// Σ_k w[r][k]·x[k] for `R` rows and one lane, each (row, lane) sum in the same order as
/// [`float_tile_512`]'s, one row after another so the weights stream in order (the hardware
/// prefetcher follows one stream better than four side by side: decode, where a lane is alone).
#[target_feature(enable = "avx512f")]
fn float_tile_512_rows<const R: usize>(fmt: WeightFormat, w: [&[u8]; R], xs: &[f32], cols: usize) -> [f32; R] {
    let main = cols - cols % 16;
    let mut acc = [_mm512_setzero_ps(); R];
    let mut k = 0;
    while k < main {
        let xk = &xs[k..k + 16];
        // SAFETY: `xk` holds exactly 16 f32; loadu has no alignment requirement.
        let xv = unsafe { _mm512_loadu_ps(xk.as_ptr()) };
        for r in 0..R {
            acc[r] = _mm512_fmadd_ps(load_w16(fmt, w[r], k), xv, acc[r]);
        }
        k += 16;
    }
    std::array::from_fn(|r| add_tail(_mm512_reduce_add_ps(acc[r]), fmt, w[r], xs, main, cols))
}

/// The stored float kinds as const parameters of [`float_tile_512`].
const KIND_F32: u8 = 0;
const KIND_F16: u8 = 1;
const KIND_BF16: u8 = 2;

/// The weight format of a stored float kind (for the scalar tails).
const fn kind_format(kind: u8) -> WeightFormat {
    match kind {
        KIND_F32 => WeightFormat::F32,
        KIND_F16 => WeightFormat::F16,
        _ => WeightFormat::BF16,
    }
}

/// Sixteen stored values of kind `K` at `p` as f32 (512-bit).
///
/// # Safety
/// `p` must point at 16 readable values of kind `K` (64 or 32 bytes).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load16<const K: u8>(p: *const u8) -> __m512 {
    // SAFETY: the caller guarantees the 16 values; loadu has no alignment requirement.
    unsafe {
        match K {
            KIND_F32 => _mm512_loadu_ps(p.cast()),
            KIND_F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())),
            _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
                p.cast(),
            )))),
        }
    }
}

/// Σ_k w[r][k]·x[j][k] for 4 rows and `L` lanes with 512-bit vectors, weights of the stored kind
/// `K` (known at compile time, so no format test per vector; the bounds checked once). Every
/// lane's sum runs in the same order whatever `L`.
#[target_feature(enable = "avx512f")]
fn float_tile_512<const L: usize, const K: u8>(
    w: [&[u8]; TILE_ROWS],
    xs: [&[f32]; L],
    cols: usize,
) -> [[f32; TILE_ROWS]; L] {
    let esize = if K == KIND_F32 { 4 } else { 2 };
    assert!(xs.iter().all(|x| x.len() >= cols) && w.iter().all(|r| r.len() >= cols * esize));
    let main = cols - cols % 16;
    let mut acc = [[_mm512_setzero_ps(); TILE_ROWS]; L];
    let mut k = 0;
    while k < main {
        let at = k * esize;
        // Four rows stream side by side, which the hardware prefetcher follows less well than
        // one: ask for each row's bytes a little ahead (a hint; past the row's end is harmless),
        // once per 64 bytes. Measured on a 9216 × 2560 F16 matrix, 32 lanes: 12.2–13.1 ms with,
        // 12.7–15.4 without.
        if at % 64 == 0 {
            for row in w {
                _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().wrapping_add(at + PREFETCH_AHEAD).cast());
            }
        }
        // SAFETY: each row holds `cols` values of kind `K` (asserted) and k + 16 ≤ main ≤ cols.
        let wv: [__m512; TILE_ROWS] = std::array::from_fn(|r| unsafe { load16::<K>(w[r].as_ptr().add(at)) });
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: lane `j` holds `cols` values (asserted) and k + 16 ≤ cols.
            let xv = unsafe { _mm512_loadu_ps(xs[j].as_ptr().add(k)) };
            for r in 0..TILE_ROWS {
                a[r] = _mm512_fmadd_ps(wv[r], xv, a[r]);
            }
        }
        k += 16;
    }
    let mut out = [[0f32; TILE_ROWS]; L];
    for j in 0..L {
        for r in 0..TILE_ROWS {
            out[j][r] = add_tail(_mm512_reduce_add_ps(acc[j][r]), kind_format(K), w[r], xs[j], main, cols);
        }
    }
    out
}

/// Σ_k w[r][k]·x[j][k] for 4 rows and `L` lanes (1 or 2). Every lane's sum runs in the same
/// order whatever `L`.
#[target_feature(enable = "avx2,fma,f16c")]
fn float_tile<const L: usize>(
    fmt: WeightFormat,
    w: [&[u8]; TILE_ROWS],
    xs: [&[f32]; L],
    cols: usize,
) -> [[f32; TILE_ROWS]; L] {
    let main = cols - cols % 8;
    let mut acc = [[_mm256_setzero_ps(); TILE_ROWS]; L];
    let mut k = 0;
    while k < main {
        let wv: [__m256; TILE_ROWS] = std::array::from_fn(|r| load_w8(fmt, w[r], k));
        for (j, a) in acc.iter_mut().enumerate() {
            let xk = &xs[j][k..k + 8];
            // SAFETY: `xk` holds exactly 8 f32; loadu has no alignment requirement.
            let xv = unsafe { _mm256_loadu_ps(xk.as_ptr()) };
            for r in 0..TILE_ROWS {
                a[r] = _mm256_fmadd_ps(wv[r], xv, a[r]);
            }
        }
        k += 8;
    }
    let mut out = [[0f32; TILE_ROWS]; L];
    for j in 0..L {
        for r in 0..TILE_ROWS {
            out[j][r] = add_tail(hsum_f32(acc[j][r]), fmt, w[r], xs[j], main, cols);
        }
    }
    out
}

/// Rows per register tile of [`dot_rows4`].
pub(crate) const TILE_ROWS: usize = 4;

/// Whether [`dot_rows4`] handles weights in `fmt` (the Q8_0/Q8_1-paired formats).
pub(crate) fn tiles(fmt: WeightFormat) -> bool {
    matches!(
        fmt,
        WeightFormat::Q8_0
            | WeightFormat::Q4_0
            | WeightFormat::Q5_0
            | WeightFormat::Q4_1
            | WeightFormat::Q5_1
            | WeightFormat::IQ4_NL
    )
}

/// One block of a tiled row: its 32 weights (as u8 magnitudes when `signed`, with the original
/// signed values kept for the activation's sign), d and m.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn decode_block(fmt: WeightFormat, b: &[u8]) -> (__m256i, __m256i, f32, f32) {
    match fmt {
        WeightFormat::Q4_1 => {
            let (d, m) = f16c_pair(b);
            let w = nibbles(&b[4..20]);
            (w, w, d, m)
        }
        WeightFormat::Q5_1 => {
            let (d, m) = f16c_pair(b);
            let w = q5_1_weights(b);
            (w, w, d, m)
        }
        WeightFormat::Q8_0 => {
            let w = load256(&b[2..34]);
            (_mm256_sign_epi8(w, w), w, f16c_at(b, 0), 0.0)
        }
        WeightFormat::Q4_0 => {
            let w = _mm256_sub_epi8(nibbles(&b[2..18]), _mm256_set1_epi8(8));
            (_mm256_sign_epi8(w, w), w, f16c_at(b, 0), 0.0)
        }
        WeightFormat::IQ4_NL => {
            let w = iq4_nl_weights(&b[2..18]);
            (_mm256_sign_epi8(w, w), w, f16c_at(b, 0), 0.0)
        }
        _ => {
            let w = q5_0_weights(b);
            (_mm256_sign_epi8(w, w), w, f16c_at(b, 0), 0.0)
        }
    }
}

/// How many tiles ahead each row stream prefetches: the same block of the row `PREFETCH_TILES ·
/// TILE_ROWS` rows further on (rows of a matrix are contiguous). A fixed distance inside the row
/// did nothing for short rows (a 576-column Q4_1 row is 360 bytes, under six cache lines), so every
/// tile of a decode step started cold from DRAM.
const PREFETCH_TILES: usize = 2;

/// `dot_u8_i8` as one AVX-512 VNNI instruction (`vpdpbusd`, 256-bit form): the same exact
/// i32 sums, since neither form saturates for these operands.
#[inline]
#[target_feature(enable = "avx2,avx512vnni,avx512vl")]
fn dot_u8_i8_vnni(w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
}

/// Whether this CPU has AVX-512 VNNI with 256-bit vectors (used by [`dot_rows4_vnni`]).
pub(crate) fn has_vnni() -> bool {
    let f = crate::Features::get();
    f.avx512vnni && f.avx512vl
}

/// The register tile, generated once per instruction-set variant.
macro_rules! define_tiles {
    ($entry:ident, $tile:ident, $tile_fmt:ident, $features:literal, $dot:ident) => {
        /// `out[l][r] = rows[r] · x[lane0 + l]` for `l < out.len()`: a 4-row × 2-lane register tile, so
        /// each activation block is loaded once for four rows and each weight block decoded once for two
        /// lanes (the untiled loop re-streams every activation for every row). Accumulation per (row,
        /// lane) is the same eight-lane FMA order as [`dot_row`], so tiled and untiled results are equal.
        #[target_feature(enable = $features)]
        pub(crate) fn $entry(
            fmt: WeightFormat,
            rows: [&[u8]; TILE_ROWS],
            x: &Activations,
            lane0: usize,
            out: &mut [[f32; TILE_ROWS]],
        ) {
            let n = out.len();
            let mut l = 0;
            while l + 2 <= n {
                $tile::<2>(fmt, rows, x, lane0 + l, &mut out[l..l + 2]);
                l += 2;
            }
            if l < n {
                $tile::<1>(fmt, rows, x, lane0 + l, &mut out[l..l + 1]);
            }
        }

        /// One `TILE_ROWS × L` tile starting at lane `lane`, monomorphised per weight format so the
        /// block decode is straight-line code inside the loop.
        #[inline]
        #[target_feature(enable = $features)]
        fn $tile<const L: usize>(
            fmt: WeightFormat,
            rows: [&[u8]; TILE_ROWS],
            x: &Activations,
            lane: usize,
            out: &mut [[f32; TILE_ROWS]],
        ) {
            match fmt {
                WeightFormat::Q4_1 => $tile_fmt::<L, 1>(rows, x, lane, out),
                WeightFormat::Q8_0 => $tile_fmt::<L, 2>(rows, x, lane, out),
                WeightFormat::Q4_0 => $tile_fmt::<L, 3>(rows, x, lane, out),
                WeightFormat::IQ4_NL => $tile_fmt::<L, 5>(rows, x, lane, out),
                WeightFormat::Q5_1 => $tile_fmt::<L, 6>(rows, x, lane, out),
                _ => $tile_fmt::<L, 4>(rows, x, lane, out),
            }
        }

        /// Format codes of `tile_fmt`: 1 Q4_1, 2 Q8_0, 3 Q4_0, 4 Q5_0, 5 IQ4_NL, 6 Q5_1.
        #[inline]
        #[target_feature(enable = $features)]
        fn $tile_fmt<const L: usize, const F: u8>(
            rows: [&[u8]; TILE_ROWS],
            x: &Activations,
            lane: usize,
            out: &mut [[f32; TILE_ROWS]],
        ) {
            let fmt = match F {
                1 => WeightFormat::Q4_1,
                2 => WeightFormat::Q8_0,
                3 => WeightFormat::Q4_0,
                5 => WeightFormat::IQ4_NL,
                6 => WeightFormat::Q5_1,
                _ => WeightFormat::Q5_0,
            };
            let nb = x.cols / 32;
            let bb = fmt.block_bytes();
            let with_min = F == 1 || F == 6;
            let xq: [&[i8]; L] = std::array::from_fn(|j| &x.q[32 * nb * (lane + j)..32 * nb * (lane + j + 1)]);
            let xd: [&[f32]; L] = std::array::from_fn(|j| &x.d[nb * (lane + j)..nb * (lane + j + 1)]);
            let xs: [&[f32]; L] = std::array::from_fn(|j| {
                if with_min {
                    &x.s[nb * (lane + j)..nb * (lane + j + 1)]
                } else {
                    &[]
                }
            });
            let mut acc = [[_mm256_setzero_ps(); TILE_ROWS]; L];
            let mut mins = [[0f32; TILE_ROWS]; L];
            for ib in 0..nb {
                let xv: [__m256i; L] = std::array::from_fn(|j| load256_i8(&xq[j][32 * ib..32 * ib + 32]));
                for r in 0..TILE_ROWS {
                    let row = rows[r];
                    // A prefetch never faults and has no visible effect, so the address may lie past
                    // the matrix (last tiles); `wrapping_add` keeps that free of pointer UB.
                    let ahead = row
                        .as_ptr()
                        .wrapping_add(ib * bb + PREFETCH_TILES * TILE_ROWS * row.len());
                    _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                    let (mag, sgn, dw, mw) = decode_block(fmt, &row[ib * bb..(ib + 1) * bb]);
                    for j in 0..L {
                        let xj = if with_min {
                            xv[j]
                        } else {
                            _mm256_sign_epi8(xv[j], sgn)
                        };
                        let p = _mm256_cvtepi32_ps($dot(mag, xj));
                        acc[j][r] = _mm256_fmadd_ps(p, _mm256_set1_ps(dw * xd[j][ib]), acc[j][r]);
                        if with_min {
                            mins[j][r] += mw * xs[j][ib];
                        }
                    }
                }
            }
            for j in 0..L {
                for r in 0..TILE_ROWS {
                    out[j][r] = hsum_f32(acc[j][r]) + mins[j][r];
                }
            }
        }
    };
}

define_tiles!(dot_rows4, tile, tile_fmt, "avx2,fma,f16c", dot_u8_i8);
define_tiles!(
    dot_rows4_vnni,
    tile_vnni,
    tile_fmt_vnni,
    "avx2,fma,f16c,avx512vnni,avx512vl",
    dot_u8_i8_vnni
);
