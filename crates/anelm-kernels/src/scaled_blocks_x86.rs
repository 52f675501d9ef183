//! AVX2 kernels for [`crate::scaled_blocks`]' formats (Q2_K, Q3_K, IQ4_XS): each block decoded
//! once per row pass into eight vectors of 32 int8 weights plus, per vector, the int16 scales of
//! its sub-blocks; per lane, `maddubs` forms the pair sums of weight × activation and `madd`
//! multiplies them by the sub-block scales into exact int32 sums — the integer result of the
//! portable body, so both give the same float.

use std::arch::x86_64::*;

use crate::activations::Activations;
use crate::blocks::IQ4_NL_VALUES;
use crate::format::WeightFormat;
use crate::fp16::f16_at;
use crate::simd_x86::{load128, load256};

/// One decoded 256-element block.
struct Block {
    /// |q| (or q itself when the format is unsigned), 32 weights per vector.
    mag: [__m256i; 8],
    /// The weights' signs, applied to the activations (`_mm256_sign_epi8`); unused for Q2_K.
    sign: [__m256i; 8],
    /// Per vector, the scale of each int16 pair sum (16 lanes: bytes 0..16, then 16..32).
    scale: [__m256i; 8],
    d: f32,
    dmin: f32,
    /// Q2_K: each 16-element sub-block's minimum.
    min: [i32; 16],
    /// Whether the weights are unsigned with minimums (Q2_K).
    q2k: bool,
}

/// Two sub-block scales as one vector of pair-sum multipliers: `lo` for bytes 0..16, `hi` after.
#[inline]
#[target_feature(enable = "avx2")]
fn scale_pair(lo: i16, hi: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

/// Bits `2j..2j+2` of every byte of `v`.
#[inline]
#[target_feature(enable = "avx2")]
fn crumbs(v: __m256i, j: usize) -> __m256i {
    let shifted = match j {
        0 => v,
        1 => _mm256_srli_epi16::<2>(v),
        2 => _mm256_srli_epi16::<4>(v),
        _ => _mm256_srli_epi16::<6>(v),
    };
    _mm256_and_si256(shifted, _mm256_set1_epi8(3))
}

impl Block {
    #[target_feature(enable = "avx2")]
    fn zeroed() -> Self {
        let z = _mm256_setzero_si256();
        Self {
            mag: [z; 8],
            sign: [z; 8],
            scale: [z; 8],
            d: 0.0,
            dmin: 0.0,
            min: [0; 16],
            q2k: false,
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn decode(&mut self, fmt: WeightFormat, b: &[u8]) {
        match fmt {
            WeightFormat::Q2_K => {
                let sc = &b[0..16];
                let qs = [load256(&b[16..48]), load256(&b[48..80])];
                for (n, &v) in qs.iter().enumerate() {
                    for j in 0..4 {
                        let k = 4 * n + j;
                        self.mag[k] = crumbs(v, j);
                        self.scale[k] = scale_pair(i16::from(sc[2 * k] & 0x0F), i16::from(sc[2 * k + 1] & 0x0F));
                    }
                }
                for (m, &s) in self.min.iter_mut().zip(sc) {
                    *m = i32::from(s >> 4);
                }
                self.d = f16_at(b, 80);
                self.dmin = f16_at(b, 82);
                self.q2k = true;
            }
            WeightFormat::Q3_K => {
                let hmask = load256(&b[0..32]);
                let qs = [load256(&b[32..64]), load256(&b[64..96])];
                let scales = &b[96..108];
                let sc = |i: usize| {
                    let low = if i < 8 { scales[i] & 0x0F } else { scales[i - 8] >> 4 };
                    let high = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
                    i16::from(low | (high << 4)) - 32
                };
                let four = _mm256_set1_epi8(4);
                for (n, &v) in qs.iter().enumerate() {
                    for j in 0..4 {
                        let k = 4 * n + j;
                        let bit = _mm256_set1_epi8((1u8 << k) as i8);
                        // 4 where the high bit is clear: q = low − 4.
                        let clear = _mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), _mm256_setzero_si256());
                        let q = _mm256_sub_epi8(crumbs(v, j), _mm256_and_si256(clear, four));
                        self.mag[k] = _mm256_sign_epi8(q, q);
                        self.sign[k] = q;
                        self.scale[k] = scale_pair(sc(2 * k), sc(2 * k + 1));
                    }
                }
                self.d = f16_at(b, 108);
                self.q2k = false;
            }
            _ => {
                let scales_h = u16::from_le_bytes([b[2], b[3]]);
                let t = IQ4_NL_VALUES.map(|v| v as u8);
                let table = load128(&t);
                let table = _mm256_set_m128i(table, table);
                let low_nibble = _mm_set1_epi8(0x0F);
                for j in 0..8 {
                    let v = load128(&b[8 + 16 * j..24 + 16 * j]);
                    let idx = _mm256_set_m128i(
                        _mm_and_si128(_mm_srli_epi16::<4>(v), low_nibble),
                        _mm_and_si128(v, low_nibble),
                    );
                    let q = _mm256_shuffle_epi8(table, idx);
                    self.mag[j] = _mm256_sign_epi8(q, q);
                    self.sign[j] = q;
                    let low = (b[4 + j / 2] >> (4 * (j % 2))) & 0x0F;
                    let high = ((scales_h >> (2 * j)) & 3) as u8;
                    let s = i16::from(low | (high << 4)) - 32;
                    self.scale[j] = _mm256_set1_epi16(s);
                }
                self.d = f16_at(b, 0);
                self.q2k = false;
            }
        }
    }

    /// Σ w·x over the block for one lane's 256 int8 activations, exact.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn dot(&self, x: &[i8]) -> i32 {
        assert!(x.len() >= 256);
        let mut acc = _mm256_setzero_si256();
        for k in 0..8 {
            // SAFETY: 32 readable bytes at 32k (x holds 256, checked above).
            let xv = unsafe { _mm256_loadu_si256(x.as_ptr().add(32 * k).cast()) };
            let xs = if self.q2k {
                xv
            } else {
                _mm256_sign_epi8(xv, self.sign[k])
            };
            let pairs = _mm256_maddubs_epi16(self.mag[k], xs);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, self.scale[k]));
        }
        let s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256::<1>(acc));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<1>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// acc[l] += W_row · x[lane0 + l] for a Q2_K, Q3_K or IQ4_XS row with Q8_K activations.
#[target_feature(enable = "avx2")]
pub(crate) fn dot_row(fmt: WeightFormat, row: &[u8], x: &Activations, lane0: usize, acc: &mut [f32]) {
    let bb = fmt.block_bytes();
    let nb = x.cols / 256;
    let mut blk = Block::zeroed();
    for (ib, b) in row.chunks_exact(bb).enumerate() {
        blk.decode(fmt, b);
        for (l, a) in acc.iter_mut().enumerate() {
            let xb = (lane0 + l) * nb + ib;
            let sumi = blk.dot(&x.q[256 * xb..256 * xb + 256]);
            let dx = x.d[xb];
            *a += dx * blk.d * sumi as f32;
            if blk.q2k {
                let bs = &x.bsums[16 * xb..16 * xb + 16];
                let summin: i32 = blk.min.iter().zip(bs).map(|(&m, &s)| m * s).sum();
                *a -= dx * blk.dmin * summin as f32;
            }
        }
    }
}
