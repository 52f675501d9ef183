//! CPU-side model operations in fp32: RMSNorm, RoPE, attention over the KV cache.
//! Their arithmetic follows llama.cpp's CPU path where it matters for bit-level agreement
//! (f64 sum of squares in RMSNorm, iterated RoPE angles, optionally f16 K/V and probabilities).

use anelm_kernels::round_f16;

use crate::kv_cache::{KvRows, KvStorage};
use crate::wide::multiversion;

/// Σ term(v) over `x` in eight f64 partial sums, then the tail: one running sum is a chain of
/// dependent adds (~0.7 µs for a 576-wide row), and these sums run on the caller's thread while
/// the kernel pool's workers wait. Only the f64 rounding of the order differs from one sum.
#[inline(always)]
fn sum_f64(x: &[f32], term: impl Fn(f32) -> f64) -> f64 {
    let mut part = [0f64; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (p, &v) in part.iter_mut().zip(c) {
            *p += term(v);
        }
    }
    part.iter().sum::<f64>() + tail.iter().map(|&v| term(v)).sum::<f64>()
}

multiversion! {
    /// y = x / sqrt(mean(x²) + eps) ⊙ (w + offset). `offset` is 0 for Llama, 1 for `(1 + w)`
    /// norms.
    pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, offset: f32, y: &mut [f32]) = rms_norm_body {
        let scale = rms_scale(x, eps);
        for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
            *y = (x * scale) * (w + offset);
        }
    }
}

multiversion! {
    /// [`rms_norm`] of `x` into itself (each output reads only its own input and the scale, so
    /// the values are the same): the per-head QK-norms, without a copy of each head.
    pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32, offset: f32) = rms_norm_in_place_body {
        let scale = rms_scale(x, eps);
        for (x, &w) in x.iter_mut().zip(w) {
            *x = (*x * scale) * (w + offset);
        }
    }
}

/// `1 / sqrt(mean(x²) + eps)`, the mean from an f64 sum (each square of an f32 is exact in f64).
#[inline(always)]
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum = sum_f64(x, |v| f64::from(v) * f64::from(v));
    let mean = (sum / x.len().max(1) as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// LayerNorm: y = (x − mean) / sqrt(var + eps) ⊙ w + b, mean and variance from f64 sums
/// (BERT's post-norm blocks and embeddings).
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, y: &mut [f32]) {
    let n = x.len().max(1) as f64;
    let mean = sum_f64(x, f64::from) / n;
    let var = sum_f64(x, |v| {
        let d = f64::from(v) - mean;
        d * d
    }) / n;
    let scale = (1.0 / (var + f64::from(eps)).sqrt()) as f32;
    let mean = mean as f32;
    for (((y, &x), &w), &b) in y.iter_mut().zip(x).zip(w).zip(b) {
        *y = (x - mean) * scale * w + b;
    }
}

/// GELU as BERT defines it (`gelu`, not the tanh approximation): 0.5·x·(1 + erf(x/√2)).
#[inline(always)]
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// The error function in f32: Numerical Recipes' `erfc` Chebyshev fit (|error| < 1.2e-7 in
/// exact arithmetic), a few f32 roundings more here, far below what GELU's result keeps.
#[inline(always)]
fn erf(x: f32) -> f32 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_204 + t * (1.488_515_9 + t * (-0.822_152_2 + t * 0.170_872_77))))))));
    let erfc = t * anelm_kernels::exp_f32(poly);
    if x >= 0.0 { 1.0 - erfc } else { erfc - 1.0 }
}

/// GELU with the tanh approximation (`gelu_pytorch_tanh`):
/// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// x·σ(x).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + anelm_kernels::exp_f32(-x))
}

/// σ(x) = 1 / (1 + e^(−x)).
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// ln(1 + eˣ), linear above 20 as torch's softplus is.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// Which elements RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePairing {
    /// (x[2i], x[2i+1]): GGUF Llama files, whose converter permuted the Q/K rows.
    Adjacent,
    /// (x[i], x[i + d/2]) ("rotate half"): Hugging Face checkpoints.
    Halves,
}

/// Rotary position embedding over the first `dims` elements of each head.
#[derive(Clone, Debug)]
pub struct Rope {
    dims: usize,
    pairing: RopePairing,
    theta_scale: f32,
    /// Long-RoPE: each pair's frequency divided by its factor, and cos/sin times `mscale`.
    scaling: Option<(Vec<f32>, f32)>,
}

impl Rope {
    /// RoPE with base `theta` over `dims` (even) dimensions.
    pub fn new(dims: usize, theta: f32, pairing: RopePairing) -> Self {
        Self {
            dims,
            pairing,
            theta_scale: theta.powf(-2.0 / dims as f32),
            scaling: None,
        }
    }

    /// Long-RoPE (Phi-3): pair `i`'s frequency divided by `factors[i]`, and the cos and sin
    /// multiplied by `mscale` (transformers' `attention_factor`).
    pub fn with_scaling(mut self, factors: Vec<f32>, mscale: f32) -> Self {
        self.scaling = Some((factors, mscale));
        self
    }

    /// Fill `cs` with (cos, sin) for each of the `dims/2` pairs at position `pos`
    /// (angles iterated as pos·scale^i, the way ggml builds its cache).
    pub fn angles(&self, pos: usize, cs: &mut Vec<(f32, f32)>) {
        cs.clear();
        let mut theta = pos as f32;
        match &self.scaling {
            None => {
                for _ in 0..self.dims / 2 {
                    cs.push((theta.cos(), theta.sin()));
                    theta *= self.theta_scale;
                }
            }
            Some((factors, mscale)) => {
                for i in 0..self.dims / 2 {
                    let t = theta / factors.get(i).copied().unwrap_or(1.0);
                    cs.push((t.cos() * mscale, t.sin() * mscale));
                    theta *= self.theta_scale;
                }
            }
        }
    }

    /// Rotate one head in place with precomputed angles.
    pub fn apply(&self, head: &mut [f32], cs: &[(f32, f32)]) {
        rotate(head, cs, self.dims / 2, self.pairing == RopePairing::Adjacent);
    }
}

multiversion! {
    /// RoPE's rotation of the first `2·half` values of `head` by the angles `cs`, pairs adjacent
    /// or halves apart.
    fn rotate(head: &mut [f32], cs: &[(f32, f32)], half: usize, adjacent: bool) = rotate_body {
        let cs = &cs[..half.min(cs.len())];
        // Straight element-wise loops (no index arithmetic per pair), so each vectorises.
        if adjacent {
            for (p, &(c, s)) in head[..2 * half].chunks_exact_mut(2).zip(cs) {
                let (x0, x1) = (p[0], p[1]);
                p[0] = x0 * c - x1 * s;
                p[1] = x0 * s + x1 * c;
            }
        } else {
            let (lo, hi) = head[..2 * half].split_at_mut(half);
            for ((a, b), &(c, s)) in lo.iter_mut().zip(hi.iter_mut()).zip(cs) {
                let (x0, x1) = (*a, *b);
                *a = x0 * c - x1 * s;
                *b = x0 * s + x1 * c;
            }
        }
    }
}

/// Σ a·b with eight independent partial sums (AVX2 at run time where the CPU has it; the same
/// order either way, see `anelm_kernels::dot_f32`).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    anelm_kernels::dot_f32(a, b)
}

/// How attention stores and rounds its operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionPrecision {
    /// K, V, q and the softmax probabilities rounded to f16, as llama.cpp's non-flash CPU path
    /// does (GGUF models: bit-level agreement with llama.cpp).
    F16,
    /// Everything in f32, as transformers computes an fp32 checkpoint (safetensors models).
    F32,
}

impl AttentionPrecision {
    /// The cache storage that holds every value [`AttentionPrecision::store`] yields exactly.
    pub fn kv_storage(self) -> KvStorage {
        match self {
            Self::F16 => KvStorage::F16,
            Self::F32 => KvStorage::F32,
        }
    }

    /// A K or V value as the cache stores it.
    #[inline]
    pub fn store(self, x: f32) -> f32 {
        match self {
            Self::F16 => round_f16(x),
            Self::F32 => x,
        }
    }
}

/// Where one head's rows sit in the cache and how its scores are formed.
#[derive(Clone, Copy, Debug)]
pub struct AttendParams {
    /// Floats per cached position (all KV heads).
    pub stride: usize,
    /// Offset of this KV head inside a cached row.
    pub offset: usize,
    /// Score multiplier (1/√head_dim, or the model's own).
    pub scale: f32,
    /// `cap · tanh(score / cap)` on the scaled scores (Gemma 2/3 `attn_logit_softcapping`).
    pub softcap: Option<f32>,
    /// Rounding of q and the probabilities (K/V are rounded when stored).
    pub precision: AttentionPrecision,
}

/// Reusable buffers of [`attend_group`] (one per thread, so the hot path does not allocate).
#[derive(Debug, Default)]
pub struct AttendScratch {
    q: Vec<f32>,
    scores: Vec<f32>,
}

multiversion! {
    /// The query heads `qs` (each `d` floats) of one KV head attending over its cached rows `slots`
    /// (ranges of row indices in position order: one for a plain cache, two when a ring buffer
    /// wraps); head `h`'s output goes to `out[h·d..(h + 1)·d]`. `k`/`v` hold rows of `p.stride`
    /// values; the KV head's slice starts at `p.offset` in each row. Each row is read once for the
    /// whole group. Softmax in f32 with an f64 sum; with [`AttentionPrecision::F16`] q is rounded to
    /// f16 once and the probabilities before weighting V, as llama.cpp's non-flash CPU path does.
    pub fn attend_group(
        qs: &[&[f32]],
        k: KvRows<'_>,
        v: KvRows<'_>,
        slots: &[std::ops::Range<usize>],
        p: &AttendParams,
        scratch: &mut AttendScratch,
        out: &mut [f32],
    ) = attend_group_body {
        let Some(d) = qs.first().map(|q| q.len()) else {
            return;
        };
        let g = qs.len();
        let n: usize = slots.iter().map(|r| r.len()).sum();
        let AttendScratch { q, scores } = scratch;
        q.clear();
        for head in qs {
            q.extend_from_slice(head);
        }
        if p.precision == AttentionPrecision::F16 {
            anelm_kernels::round_f16_slice(q);
        }
        scores.clear();
        scores.resize(g * n, 0.0);
        score_slots(q, d, k, p, slots, scores, n);
        for s in scores.chunks_mut(n.max(1)) {
            softmax_scores(s, p);
        }
        out[..g * d].fill(0.0);
        weigh_slots(scores, n, v, p, slots, &mut out[..g * d], d);
    }
}

/// Scores of the queries `q` (`d` values each) against the cached rows of `slots` (slot ranges
/// in position order): query `h`'s score of the `i`-th row at `scores[h·stride + i]`.
#[inline(always)]
fn score_slots(
    q: &[f32],
    d: usize,
    k: KvRows<'_>,
    p: &AttendParams,
    slots: &[std::ops::Range<usize>],
    scores: &mut [f32],
    stride: usize,
) {
    let mut done = 0;
    for r in slots {
        anelm_kernels::dot_rows_group(q, d, k, p.stride, p.offset, r.clone(), &mut scores[done..], stride);
        done += r.len();
    }
}

/// `out_h += Σ_i scores[h·stride + i] · row_i` over the cached rows of `slots` in position order,
/// for the `out.len() / d` queries.
#[inline(always)]
fn weigh_slots(
    scores: &[f32],
    stride: usize,
    v: KvRows<'_>,
    p: &AttendParams,
    slots: &[std::ops::Range<usize>],
    out: &mut [f32],
    d: usize,
) {
    let mut done = 0;
    for r in slots {
        anelm_kernels::weighted_rows_group(&scores[done..], stride, v, p.stride, p.offset, r.clone(), out, d);
        done += r.len();
    }
}

/// The queries of an [`attend_tile`]: token `t`'s `heads` query heads of `head_dim` values
/// (`qs[(t·heads + h)·head_dim ..]`, all sharing one KV head) attend to the cached positions
/// `spans[t]`.
#[derive(Clone, Copy, Debug)]
pub struct Tile<'a> {
    /// Token after token, head after head.
    pub qs: &'a [f32],
    /// Query heads per token.
    pub heads: usize,
    /// Values per head.
    pub head_dim: usize,
    /// The positions each token attends to.
    pub spans: &'a [std::ops::Range<usize>],
}

/// The cached positions one token of an [`attend_tile`] attends to, as slot ranges of its cache
/// (oldest first; two when a ring wraps): `KvLayer::segments`.
pub type Segments<'a> = dyn Fn(std::ops::Range<usize>) -> [std::ops::Range<usize>; 2] + Sync + 'a;

multiversion! {
    /// [`attend_group`] for a tile of tokens of one sequence at once (see [`Tile`]): head `h` of
    /// token `t` writes `out[(t·g + h)·d ..]`. The positions every token of the tile attends
    /// to are scored and weighted by all `T·g` queries in one call of the row kernels (each row
    /// read once for the tile, and the scores with the rows in the vector lanes); the rest per
    /// token, in position order. Each query's scores, probabilities and output are those
    /// [`attend_group`] gives for its token alone, bit for bit (the same dot per row, the same
    /// softmax over the same scores, the same row-by-row accumulation in position order).
    pub fn attend_tile(
        tile: &Tile<'_>,
        segments: &Segments<'_>,
        k: KvRows<'_>,
        v: KvRows<'_>,
        p: &AttendParams,
        scratch: &mut AttendScratch,
        out: &mut [f32],
    ) = attend_tile_body {
        let Tile { qs, heads: g, head_dim: d, spans } = *tile;
        let tokens = spans.len();
        let nq = tokens * g;
        if nq == 0 || d == 0 {
            return;
        }
        let first = spans.iter().map(|s| s.start).min().unwrap_or(0);
        let last = spans.iter().map(|s| s.end).max().unwrap_or(0);
        // Positions every token attends to (empty when the spans do not overlap).
        let shared = spans.iter().map(|s| s.start).max().unwrap_or(0)..spans.iter().map(|s| s.end).min().unwrap_or(0);
        let width = (last - first).max(1);
        let AttendScratch { q, scores } = scratch;
        q.clear();
        q.extend_from_slice(&qs[..nq * d]);
        if p.precision == AttentionPrecision::F16 {
            anelm_kernels::round_f16_slice(q);
        }
        // Grown, never cleared: every score a query reads (its own span) is written first, and
        // zeroing the whole tile (up to a megabyte a call at 4,096 positions) cost more than the
        // softmax.
        if scores.len() < nq * width {
            scores.resize(nq * width, 0.0);
        }
        // The token's own positions before and after the shared ones (all of them when nothing
        // is shared); an empty range has no slots.
        let own = |s: &std::ops::Range<usize>| {
            if shared.is_empty() {
                [s.clone(), s.end..s.end]
            } else {
                [s.start..shared.start, shared.end..s.end]
            }
        };
        let slots = |r: std::ops::Range<usize>| if r.is_empty() { [0..0, 0..0] } else { segments(r) };
        // Where query `t·g`'s score of position `pos` sits (the tile's queries are `width` apart).
        let at = |t: usize, pos: usize| t * g * width + pos - first;
        score_slots(q, d, k, p, &slots(shared.clone()), &mut scores[at(0, shared.start)..], width);
        for (t, s) in spans.iter().enumerate() {
            let qt = &q[t * g * d..(t + 1) * g * d];
            for part in own(s) {
                score_slots(qt, d, k, p, &slots(part.clone()), &mut scores[at(t, part.start)..], width);
            }
        }
        for (i, row) in scores[..nq * width].chunks_mut(width).enumerate() {
            let s = &spans[i / g];
            softmax_scores(&mut row[s.start - first..s.end - first], p);
        }
        out[..nq * d].fill(0.0);
        // Per token the rows in position order: its own before the shared ones, the shared ones
        // (all queries at once), its own after them.
        let weigh_own = |out: &mut [f32], after: bool| {
            for (t, s) in spans.iter().enumerate() {
                let part = own(s)[usize::from(after)].clone();
                let o = &mut out[t * g * d..(t + 1) * g * d];
                weigh_slots(&scores[at(t, part.start)..], width, v, p, &slots(part), o, d);
            }
        };
        weigh_own(out, false);
        weigh_slots(&scores[at(0, shared.start)..], width, v, p, &slots(shared.clone()), &mut out[..nq * d], d);
        weigh_own(out, true);
    }
}

/// Scale (and soft-cap) one head's raw scores, then turn them into probabilities in place.
#[inline(always)]
fn softmax_scores(scores: &mut [f32], p: &AttendParams) {
    // One straight loop per stage (the soft-cap test and the precision test outside them), so
    // each vectorises.
    match p.softcap {
        Some(cap) => scores.iter_mut().for_each(|s| *s = cap * (*s * p.scale / cap).tanh()),
        None => scores.iter_mut().for_each(|s| *s *= p.scale),
    }
    // Maximum and sum in eight independent lanes each (one running value was a chain of
    // dependent operations per cached position). The maximum is exact in any order.
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = scores.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &s) in lanes.iter_mut().zip(c) {
            *m = m.max(s);
        }
    }
    let max = lanes.iter().chain(tail).fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    for s in scores.iter_mut() {
        *s = anelm_kernels::exp_f32(*s - max);
    }
    let sum = sum_f64(scores, f64::from);
    let inv = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    scores.iter_mut().for_each(|s| *s *= inv);
    if p.precision == AttentionPrecision::F16 {
        anelm_kernels::round_f16_slice(scores);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rms() {
        let x = [3.0f32, -4.0, 0.0, 5.0];
        let w = [1.0f32; 4];
        let mut y = [0.0f32; 4];
        rms_norm(&x, &w, 0.0, 0.0, &mut y);
        let rms = (y.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6, "rms {rms}");
        rms_norm(&x, &[0.0; 4], 0.0, 1.0, &mut y);
        assert!((y[0] - 3.0 / (12.5f32).sqrt()).abs() < 1e-6);
    }

    #[test]
    fn rope_pairings_rotate_the_right_elements() {
        let rope_adj = Rope::new(4, 10000.0, RopePairing::Adjacent);
        let rope_half = Rope::new(4, 10000.0, RopePairing::Halves);
        let mut cs = Vec::new();
        rope_adj.angles(1, &mut cs);
        // First pair angle is pos·1 = 1 rad.
        let (c, s) = (1f32.cos(), 1f32.sin());
        let mut a = [1.0, 0.0, 0.0, 0.0];
        rope_adj.apply(&mut a, &cs);
        assert!((a[0] - c).abs() < 1e-6 && (a[1] - s).abs() < 1e-6 && a[2] == 0.0);
        let mut h = [1.0, 0.0, 0.0, 0.0];
        rope_half.apply(&mut h, &cs);
        assert!((h[0] - c).abs() < 1e-6 && (h[2] - s).abs() < 1e-6 && h[1] == 0.0);
        // Rotation preserves the norm at any position.
        rope_half.angles(1234, &mut cs);
        let mut x = [0.3, -1.2, 2.0, 0.7];
        let n0: f32 = x.iter().map(|v| v * v).sum();
        rope_half.apply(&mut x, &cs);
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
    }

    fn attend(q: &[f32], k: KvRows<'_>, v: KvRows<'_>, slots: &[std::ops::Range<usize>], out: &mut [f32]) {
        let p = AttendParams {
            stride: 2,
            offset: 0,
            scale: 1.0,
            softcap: None,
            precision: AttentionPrecision::F16,
        };
        attend_group(&[q], k, v, slots, &p, &mut AttendScratch::default(), out);
    }

    #[test]
    fn attention_picks_the_matching_key() {
        // Two cached positions; the query matches the second key strongly.
        let q = [0.0, 8.0];
        let (k, v) = ([8.0, 0.0, 0.0, 8.0], [1.0, 2.0, 3.0, 4.0]);
        let (k, v) = (KvRows::F32(&k), KvRows::F32(&v));
        let mut out = [0.0; 2];
        let all = std::slice::from_ref(&(0..2));
        attend(&q, k, v, all, &mut out);
        assert!((out[0] - 3.0).abs() < 1e-3 && (out[1] - 4.0).abs() < 1e-3, "{out:?}");
        // With equal scores the output is the mean of the values.
        attend(&[0.0, 0.0], k, v, all, &mut out);
        assert!((out[0] - 2.0).abs() < 1e-3 && (out[1] - 3.0).abs() < 1e-3, "{out:?}");
        // Split into two slot ranges (a wrapped ring), in the same order: the same result.
        let mut split = [0.0; 2];
        attend(&[0.0, 0.0], k, v, &[0..1, 1..2], &mut split);
        assert_eq!(split, out);
    }

    #[test]
    fn a_group_of_heads_equals_each_head_alone_in_either_storage() {
        let (d, kv_heads, n) = (64, 3, 37);
        let stride = kv_heads * d;
        let val = |i: usize, s: u32| ((i as u32).wrapping_mul(2654435761).wrapping_add(s) >> 9) as f32 / 8.4e6 - 1.0;
        let k32: Vec<f32> = (0..n * stride).map(|i| round_f16(val(i, 1))).collect();
        let v32: Vec<f32> = (0..n * stride).map(|i| round_f16(val(i, 2))).collect();
        let k16: Vec<u16> = k32.iter().map(|&x| anelm_kernels::f32_to_f16(x)).collect();
        let v16: Vec<u16> = v32.iter().map(|&x| anelm_kernels::f32_to_f16(x)).collect();
        let qs: Vec<Vec<f32>> = (0..3).map(|h| (0..d).map(|i| val(i, 10 + h) * 2.0).collect()).collect();
        let q_refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
        let p = AttendParams {
            stride,
            offset: d,
            scale: 0.125,
            softcap: Some(30.0),
            precision: AttentionPrecision::F16,
        };
        let slots = [5..n, 0..5];
        let mut scratch = AttendScratch::default();
        let mut alone = vec![0.0; 3 * d];
        for (h, q) in q_refs.iter().enumerate() {
            let (k, v) = (KvRows::F32(&k32), KvRows::F32(&v32));
            attend_group(&[q], k, v, &slots, &p, &mut scratch, &mut alone[h * d..(h + 1) * d]);
        }
        for (k, v) in [
            (KvRows::F32(&k32), KvRows::F32(&v32)),
            (KvRows::F16(&k16), KvRows::F16(&v16)),
        ] {
            let mut group = vec![0.0; 3 * d];
            attend_group(&q_refs, k, v, &slots, &p, &mut scratch, &mut group);
            assert_eq!(
                group.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                alone.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The dispatching functions (the AVX-512 or AVX2 copy on such a CPU) against their bodies
    /// compiled for the baseline: equal bit for bit, on lengths with vector tails, extreme
    /// values, soft-capped and f16-rounded attention.
    #[test]
    fn wide_copies_equal_the_baseline_bit_for_bit() {
        let val = |i: usize, s: u32| ((i as u32).wrapping_mul(2654435761).wrapping_add(s) >> 9) as f32 / 8.4e6 - 1.0;
        for n in [1usize, 7, 8, 31, 64, 577] {
            let x: Vec<f32> = (0..n).map(|i| val(i, 3) * if i % 5 == 0 { 3e4 } else { 1.0 }).collect();
            let w: Vec<f32> = (0..n).map(|i| val(i, 4)).collect();
            let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
            rms_norm(&x, &w, 1e-6, 1.0, &mut a);
            rms_norm_body(&x, &w, 1e-6, 1.0, &mut b);
            assert_eq!(bits(&a), bits(&b), "rms_norm n={n}");
            let mut c = x.clone();
            rms_norm_in_place(&mut c, &w, 1e-6, 1.0);
            assert_eq!(bits(&a), bits(&c), "rms_norm_in_place n={n}");
        }
        for (dims, pairing) in [
            (64, RopePairing::Adjacent),
            (128, RopePairing::Halves),
            (10, RopePairing::Adjacent),
        ] {
            let rope = Rope::new(dims, 10000.0, pairing);
            let mut cs = Vec::new();
            rope.angles(4321, &mut cs);
            let head: Vec<f32> = (0..dims + 6).map(|i| val(i, 5) * 40.0).collect();
            let (mut a, mut b) = (head.clone(), head);
            rope.apply(&mut a, &cs);
            rotate_body(&mut b, &cs, dims / 2, pairing == RopePairing::Adjacent);
            assert_eq!(bits(&a), bits(&b), "rope {dims} {pairing:?}");
        }
        let (d, n) = (64, 203);
        let k: Vec<f32> = (0..n * d).map(|i| round_f16(val(i, 1) * 6.0)).collect();
        let v: Vec<f32> = (0..n * d).map(|i| round_f16(val(i, 2))).collect();
        let qs: Vec<Vec<f32>> = (0..3).map(|h| (0..d).map(|i| val(i, 10 + h) * 3.0).collect()).collect();
        let q_refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
        for (softcap, precision) in [(None, AttentionPrecision::F16), (Some(30.0), AttentionPrecision::F32)] {
            let p = AttendParams {
                stride: d,
                offset: 0,
                scale: 0.125,
                softcap,
                precision,
            };
            let slots = [9..n, 0..9];
            let mut scratch = AttendScratch::default();
            let [a, b] = [false, true].map(|baseline| {
                let (kr, vr, mut o) = (KvRows::F32(&k), KvRows::F32(&v), vec![0.0; 3 * d]);
                if baseline {
                    attend_group_body(&q_refs, kr, vr, &slots, &p, &mut scratch, &mut o);
                } else {
                    attend_group(&q_refs, kr, vr, &slots, &p, &mut scratch, &mut o);
                }
                o
            });
            assert_eq!(bits(&a), bits(&b), "attention {softcap:?} {precision:?}");
        }
    }
}
