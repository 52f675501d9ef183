//! Gated DeltaNet (the linear-attention layer of Qwen3.5), the CPU part between its fused input
//! projection and its output projection, one token at a time against the session's state:
//!
//! 1. depthwise causal conv1d (kernel k) over `[q | k | v]` with the previous k − 1 inputs, SiLU;
//! 2. q and k l2-normalised per key head (`x · rsqrt(Σx² + 1e-6)`), q scaled by 1/√dk; value head
//!    `vh` reads key head `vh / (Hv / Hk)` (transformers' `repeat_interleave`), or `vh % Hk` when
//!    the file stores the value heads tiled (llama.cpp's GGUF layout, [`VHeadOrder::Tiled`]);
//! 3. β = σ(b), g = exp(−exp(A_log) · softplus(a + dt_bias));
//! 4. decay first, then the delta rule: S ← g·S; u = Sᵀk; S ← S + β·k·(v − u)ᵀ; y = Sᵀq;
//! 5. y per value head through the gated RMSNorm (plain `w`) times SiLU(z).

use rayon::prelude::*;

use crate::error::{EngineError, Result};
use crate::ops::{sigmoid, silu, softplus};
use crate::session::RecurrentLayer;

/// How value heads are ordered in a file's linear-attention tensors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VHeadOrder {
    /// Hugging Face: grouped by key head, value head `vh` reads key head `vh / (Hv / Hk)`.
    #[default]
    Grouped,
    /// llama.cpp's GGUF: tiled over the key heads, value head `vh` reads key head `vh % Hk`.
    Tiled,
}

/// Shape of one Gated DeltaNet layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetShape {
    /// Key heads (Hk).
    pub n_k_heads: usize,
    /// Value heads (Hv, a multiple of Hk).
    pub n_v_heads: usize,
    /// Width of a key head (dk).
    pub k_dim: usize,
    /// Width of a value head (dv).
    pub v_dim: usize,
    /// Causal conv kernel length.
    pub conv_kernel: usize,
}

impl DeltaNetShape {
    /// Width of all key heads (K = Hk·dk).
    pub fn key_width(&self) -> usize {
        self.n_k_heads * self.k_dim
    }
    /// Width of all value heads (V = Hv·dv).
    pub fn value_width(&self) -> usize {
        self.n_v_heads * self.v_dim
    }
    /// Channels of the conv: q, k and v (2K + V).
    pub fn conv_dim(&self) -> usize {
        2 * self.key_width() + self.value_width()
    }
    /// Width of the fused input projection's output: `[q k v | z | b | a]`.
    pub fn proj_width(&self) -> usize {
        self.conv_dim() + self.value_width() + 2 * self.n_v_heads
    }
    /// Floats of conv state per session.
    pub fn conv_state_len(&self) -> usize {
        self.conv_kernel.saturating_sub(1) * self.conv_dim()
    }
    /// Floats of recurrent state per session (Hv·dk·dv).
    pub fn state_len(&self) -> usize {
        self.n_v_heads * self.k_dim * self.v_dim
    }
    /// A zeroed per-session state for one layer.
    pub fn new_state(&self) -> RecurrentLayer {
        RecurrentLayer::zeros(self.conv_state_len(), self.state_len())
    }
}

/// The per-layer constants of a Gated DeltaNet layer (all f32).
pub struct GatedDeltaNet {
    /// Dimensions.
    pub shape: DeltaNetShape,
    /// Conv weights `[conv_dim][kernel]`.
    pub conv_w: Vec<f32>,
    /// −exp(A_log) per value head.
    pub neg_a: Vec<f32>,
    /// dt_bias per value head.
    pub dt_bias: Vec<f32>,
    /// Gated RMSNorm weight (`dv`, used as stored).
    pub norm_w: Vec<f32>,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Value-head order of the weights.
    pub order: VHeadOrder,
}

impl GatedDeltaNet {
    /// Check the constants against the shape. `neg_a` is −exp(A_log) per value head (llama.cpp's
    /// `ssm_a`; Hugging Face files store `A_log`, see [`GatedDeltaNet::neg_a_from_log`]).
    pub fn new(
        shape: DeltaNetShape,
        conv_w: Vec<f32>,
        neg_a: Vec<f32>,
        dt_bias: Vec<f32>,
        norm_w: Vec<f32>,
        eps: f32,
        order: VHeadOrder,
    ) -> Result<Self> {
        let hv = shape.n_v_heads;
        if shape.n_k_heads == 0 || hv % shape.n_k_heads != 0 || shape.conv_kernel == 0 {
            return Err(EngineError::Config(
                "linear attention: value heads must be a positive multiple of key heads, conv kernel ≥ 1".into(),
            ));
        }
        let bad = |what: &str, got: usize, want: usize| {
            Err(EngineError::Config(format!(
                "linear attention: {what} has {got} values, expected {want}"
            )))
        };
        if conv_w.len() != shape.conv_dim() * shape.conv_kernel {
            return bad("conv1d.weight", conv_w.len(), shape.conv_dim() * shape.conv_kernel);
        }
        if neg_a.len() != hv {
            return bad("A_log", neg_a.len(), hv);
        }
        if dt_bias.len() != hv {
            return bad("dt_bias", dt_bias.len(), hv);
        }
        if norm_w.len() != shape.v_dim {
            return bad("norm.weight", norm_w.len(), shape.v_dim);
        }
        Ok(Self {
            shape,
            conv_w,
            neg_a,
            dt_bias,
            norm_w,
            eps,
            order,
        })
    }

    /// −exp(A_log), element by element.
    pub fn neg_a_from_log(a_log: &[f32]) -> Vec<f32> {
        a_log.iter().map(|a| -a.exp()).collect()
    }

    /// One token: `proj` is the fused projection's output `[q k v | z | b | a]`, `out` receives
    /// the gated, normalised output (V floats) for the output projection. `conv` is scratch of
    /// `conv_dim` floats.
    pub fn step(&self, st: &mut RecurrentLayer, proj: &[f32], conv: &mut [f32], out: &mut [f32]) {
        let s = &self.shape;
        let (cd, kk) = (s.conv_dim(), s.conv_kernel);
        let (kw, vw) = (s.key_width(), s.value_width());
        let (mixed, rest) = proj.split_at(cd);
        let (z, rest) = rest.split_at(vw);
        let (b, a) = rest.split_at(s.n_v_heads);
        // 1. Causal depthwise conv: history (oldest first) then the current input; SiLU.
        let hist = kk - 1;
        for (c, y) in conv.iter_mut().enumerate().take(cd) {
            let w = &self.conv_w[c * kk..(c + 1) * kk];
            let mut acc = w[hist] * mixed[c];
            for (j, &wj) in w[..hist].iter().enumerate() {
                acc += wj * st.conv[j * cd + c];
            }
            *y = silu(acc);
        }
        if hist > 0 {
            st.conv.copy_within(cd.., 0);
            st.conv[(hist - 1) * cd..].copy_from_slice(mixed);
        }
        // 2. l2-normalised q (scaled by 1/√dk) and k per key head.
        let (q, kv) = conv[..cd].split_at_mut(kw);
        let (k, v) = kv.split_at_mut(kw);
        let qscale = 1.0 / (s.k_dim as f32).sqrt();
        for (qh, kh) in q.chunks_mut(s.k_dim).zip(k.chunks_mut(s.k_dim)) {
            l2_normalize(qh, qscale);
            l2_normalize(kh, 1.0);
        }
        let (q, k, v) = (&*q, &*k, &*v);
        let ratio = s.n_v_heads / s.n_k_heads;
        let (dk, dv) = (s.k_dim, s.v_dim);
        // 3.–5. Per value head, in parallel: decay, delta rule, readout, gated norm.
        st.state
            .par_chunks_mut(dk * dv)
            .zip(out.par_chunks_mut(dv))
            .enumerate()
            .for_each(|(vh, (sm, o))| {
                let kh = match self.order {
                    VHeadOrder::Grouped => vh / ratio,
                    VHeadOrder::Tiled => vh % s.n_k_heads,
                };
                let (qv, kvec) = (&q[kh * dk..(kh + 1) * dk], &k[kh * dk..(kh + 1) * dk]);
                let vv = &v[vh * dv..(vh + 1) * dv];
                let beta = sigmoid(b[vh]);
                let decay = (self.neg_a[vh] * softplus(a[vh] + self.dt_bias[vh])).exp();
                sm.iter_mut().for_each(|x| *x *= decay);
                // u = Sᵀk, then delta = β(v − u).
                let mut delta = vec![0.0f32; dv];
                for (row, &ki) in sm.chunks_exact(dv).zip(kvec) {
                    for (d, &sij) in delta.iter_mut().zip(row) {
                        *d += sij * ki;
                    }
                }
                for (d, &vj) in delta.iter_mut().zip(vv) {
                    *d = (vj - *d) * beta;
                }
                o.fill(0.0);
                for ((row, &ki), &qi) in sm.chunks_exact_mut(dv).zip(kvec).zip(qv) {
                    for ((sij, &dj), oj) in row.iter_mut().zip(&delta).zip(o.iter_mut()) {
                        *sij += ki * dj;
                        *oj += *sij * qi;
                    }
                }
                // Gated RMSNorm: rmsnorm(y) ⊙ w ⊙ silu(z).
                let ms = o.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() / dv as f64;
                let r = 1.0 / (ms as f32 + self.eps).sqrt();
                let zh = &z[vh * dv..(vh + 1) * dv];
                for ((oj, &w), &zj) in o.iter_mut().zip(&self.norm_w).zip(zh) {
                    *oj = (*oj * r) * w * silu(zj);
                }
            });
    }
}

/// x ← x · rsqrt(Σx² + 1e-6) · scale.
fn l2_normalize(x: &mut [f32], scale: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let r = scale / (ss + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= r);
}
