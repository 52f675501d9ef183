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

use crate::batch::Batch;
use crate::error::{EngineError, Result};
use crate::ops::{sigmoid, silu, softplus};
use crate::session::RecurrentLayer;
use crate::wide::multiversion;

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

/// One layer's record of a speculative pass: per lane of the session, in order, the raw conv
/// input (what the conv history keeps), the conv output with q and k normalised, and per value
/// head β and the decay g — everything the recurrence reads. [`LaneTrace::replay`] advances a
/// copy of the state taken before the pass over the lanes the pass keeps, with the same
/// operations in the same order, so rejected draft tokens leave no trace in the state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LaneTrace {
    shape: Option<(DeltaNetShape, VHeadOrder)>,
    data: Vec<f32>,
}

impl LaneTrace {
    /// Forget the recorded lanes.
    pub fn clear(&mut self) {
        self.data.clear();
    }

    /// Floats one lane takes.
    fn lane_len(s: &DeltaNetShape) -> usize {
        2 * s.conv_dim() + 2 * s.n_v_heads
    }

    /// Lanes recorded.
    pub fn lanes(&self) -> usize {
        self.shape.map_or(0, |(s, _)| self.data.len() / Self::lane_len(&s))
    }

    /// Advance `st` (the state before the pass) over the first `lanes` recorded lanes.
    pub fn replay(&self, st: &mut RecurrentLayer, lanes: usize) {
        let Some((s, order)) = self.shape else { return };
        let (cd, kw, hv, hk) = (s.conv_dim(), s.key_width(), s.n_v_heads, s.n_k_heads);
        let (dk, dv) = (s.k_dim, s.v_dim);
        let hist = s.conv_kernel.saturating_sub(1);
        let (mut u, mut o) = (vec![0.0f32; dv], vec![0.0f32; dv]);
        for rec in self.data.chunks_exact(Self::lane_len(&s)).take(lanes) {
            let (mixed, rest) = rec.split_at(cd);
            let (x, rest) = rest.split_at(cd);
            let (betas, decays) = rest.split_at(hv);
            if hist > 0 {
                st.conv.copy_within(cd.., 0);
                st.conv[(hist - 1) * cd..].copy_from_slice(mixed);
            }
            for (vh, sm) in st.state.chunks_exact_mut(dk * dv).enumerate() {
                let kh = match order {
                    VHeadOrder::Grouped => vh / (hv / hk),
                    VHeadOrder::Tiled => vh % hk,
                };
                let q = &x[kh * dk..(kh + 1) * dk];
                let k = &x[kw + kh * dk..kw + (kh + 1) * dk];
                let v = &x[2 * kw + vh * dv..2 * kw + (vh + 1) * dv];
                project(sm, k, decays[vh], &mut u);
                for (d, &vj) in u.iter_mut().zip(v) {
                    *d = (vj - *d) * betas[vh];
                }
                update(sm, decays[vh], k, q, &u, &mut o);
            }
        }
    }
}

/// The per-layer constants of a Gated DeltaNet layer (all f32).
pub struct GatedDeltaNet {
    /// Dimensions.
    pub shape: DeltaNetShape,
    /// Conv weights tap-major, `[kernel][conv_dim]` (the file's `[conv_dim][kernel]`
    /// transposed at load, so the conv runs along the channels).
    pub conv_taps: Vec<f32>,
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
    /// Check the constants against the shape; `conv_w` is `[conv_dim][kernel]` as files store it. `neg_a` is −exp(A_log) per value head (llama.cpp's
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
        let (cd, kk) = (shape.conv_dim(), shape.conv_kernel);
        let conv_taps = (0..kk * cd).map(|i| conv_w[(i % cd) * kk + i / cd]).collect();
        Ok(Self {
            shape,
            conv_taps,
            neg_a,
            dt_bias,
            norm_w,
            eps,
            order,
        })
    }

    /// Value head `vh`'s decay g = exp(−exp(A_log)·softplus(a + dt_bias)) for its gate input `a`.
    fn decay(&self, vh: usize, a: f32) -> f32 {
        (self.neg_a[vh] * softplus(a + self.dt_bias[vh])).exp()
    }

    /// −exp(A_log), element by element.
    pub fn neg_a_from_log(a_log: &[f32]) -> Vec<f32> {
        a_log.iter().map(|a| -a.exp()).collect()
    }

    /// The lanes of one step through the layer. `states[i]` is session `i`'s state and
    /// `lane_state[lane]` the session a lane belongs to (a session's lanes in position order);
    /// `proj` holds each lane's fused projection `[q k v | z | b | a]`; `act` is scratch; `out`
    /// receives each lane's gated, normalised output (V floats) for the output projection.
    ///
    /// The conv runs lane by lane on the caller's thread (it is cheap and sequential per
    /// session). The recurrence runs on the kernel pool with one task per value head, and each
    /// task walks every lane in order: a head's state (dk·dv floats) stays in one core's cache
    /// for the whole step instead of moving between cores token by token, a prompt chunk
    /// costs one hand-off to the pool per layer, not one per token, and consecutive tokens of a
    /// session share a pass over the state (one pass per token instead of two).
    pub fn forward(
        &self,
        states: &mut [&mut RecurrentLayer],
        lane_state: &[usize],
        proj: &Batch,
        act: &mut Batch,
        out: &mut Batch,
    ) -> Result<()> {
        let s = &self.shape;
        let (cd, kk) = (s.conv_dim(), s.conv_kernel);
        let (kw, vw, hv) = (s.key_width(), s.value_width(), s.n_v_heads);
        let (dk, dv) = (s.k_dim, s.v_dim);
        let n = lane_state.len();
        if proj.lanes() != n || proj.channels() != s.proj_width() {
            return Err(EngineError::Config(format!(
                "linear attention: projection is {}×{}, expected {n}×{}",
                proj.lanes(),
                proj.channels(),
                s.proj_width()
            )));
        }
        let bad_state = |st: &RecurrentLayer| st.conv.len() != s.conv_state_len() || st.state.len() != s.state_len();
        if lane_state.iter().any(|&i| i >= states.len()) || states.iter().any(|st| bad_state(st)) {
            return Err(EngineError::Config(
                "linear attention: a lane names a missing or misshapen session state".into(),
            ));
        }
        // 1.–2. Causal depthwise conv and SiLU, then l2-normalised q (scaled by 1/√dk) and k.
        act.resize(n, cd);
        let hist = kk - 1;
        let qscale = 1.0 / (dk as f32).sqrt();
        // A session in a speculative pass records each lane's inputs (this pass's only).
        for st in states.iter_mut() {
            if let Some(t) = &mut st.trace {
                t.shape = Some((*s, self.order));
                t.clear();
            }
        }
        for (lane, &si) in lane_state.iter().enumerate() {
            let st = &mut *states[si];
            let mixed = &proj.lane(lane)[..cd];
            let y = act.lane_mut(lane);
            conv_silu(&self.conv_taps, &st.conv, mixed, y);
            if hist > 0 {
                st.conv.copy_within(cd.., 0);
                st.conv[(hist - 1) * cd..].copy_from_slice(mixed);
            }
            let (q, k) = y[..2 * kw].split_at_mut(kw);
            for (qh, kh) in q.chunks_mut(dk).zip(k.chunks_mut(dk)) {
                l2_normalize(qh, qscale);
                l2_normalize(kh, 1.0);
            }
            if let Some(t) = &mut st.trace {
                let p = proj.lane(lane);
                t.data.extend_from_slice(mixed);
                t.data.extend_from_slice(y);
                t.data.extend((0..hv).map(|vh| sigmoid(p[cd + vw + vh])));
                t.data.extend((0..hv).map(|vh| self.decay(vh, p[cd + vw + hv + vh])));
            }
        }
        // 3.–5. One task per value head over every lane: decay, delta rule, readout, gated norm.
        out.resize(n, vw);
        let mut jobs: Vec<HeadJob<'_>> = (0..hv)
            .map(|_| HeadJob {
                states: Vec::with_capacity(states.len()),
                outs: Vec::with_capacity(n),
            })
            .collect();
        for st in states.iter_mut() {
            for (job, sm) in jobs.iter_mut().zip(st.state.chunks_exact_mut(dk * dv)) {
                job.states.push(sm);
            }
        }
        for lane_out in out.as_mut_slice().chunks_exact_mut(vw) {
            for (job, o) in jobs.iter_mut().zip(lane_out.chunks_exact_mut(dv)) {
                job.outs.push(o);
            }
        }
        let ratio = hv / s.n_k_heads;
        let act = &*act;
        anelm_kernels::pool::global().for_each_chunk_mut(&mut jobs, 1, &|vh, job| {
            let Some(job) = job.first_mut() else { return };
            let kh = match self.order {
                VHeadOrder::Grouped => vh / ratio,
                VHeadOrder::Tiled => vh % s.n_k_heads,
            };
            // Per lane: (q, k, v, z, β, decay) of this head.
            let inputs = |lane: usize| {
                let (x, p) = (act.lane(lane), proj.lane(lane));
                let q = &x[kh * dk..(kh + 1) * dk];
                let k = &x[kw + kh * dk..kw + (kh + 1) * dk];
                let v = &x[2 * kw + vh * dv..2 * kw + (vh + 1) * dv];
                let z = &p[cd + vh * dv..cd + (vh + 1) * dv];
                let (b, a) = (p[cd + vw + vh], p[cd + vw + hv + vh]);
                (q, k, v, z, sigmoid(b), self.decay(vh, a))
            };
            // `u` holds (g·S)ᵀk of the current lane. The state is stored without the decay g its
            // next token applies: the first pass of a token only reads (`project`), and its
            // update writes g·S + k·δᵀ once (one write pass per decode token instead of two).
            // When the next lane continues the same session, its projection rides along with
            // this lane's update (one pass over the state per token instead of two).
            let (mut u, mut u_next) = (vec![0.0f32; dv], vec![0.0f32; dv]);
            let mut primed = false;
            for (lane, &si) in lane_state.iter().enumerate() {
                let (q, k, v, z, beta, decay) = inputs(lane);
                let sm = &mut *job.states[si];
                let o = &mut *job.outs[lane];
                if !primed {
                    project(sm, k, decay, &mut u);
                }
                // δ = β(v − u), in place.
                for (d, &vj) in u.iter_mut().zip(v) {
                    *d = (vj - *d) * beta;
                }
                primed = lane_state.get(lane + 1) == Some(&si);
                if primed {
                    let (_, k_next, _, _, _, decay_next) = inputs(lane + 1);
                    update_then_project(sm, (decay, k, q), &u, o, (k_next, decay_next), &mut u_next);
                    std::mem::swap(&mut u, &mut u_next);
                } else {
                    update(sm, decay, k, q, &u, o);
                }
                gated_norm(o, &self.norm_w, z, self.eps);
            }
        });
        Ok(())
    }
}

/// One value head's share of a step: its state in every session, its output in every lane.
struct HeadJob<'a> {
    states: Vec<&'a mut [f32]>,
    outs: Vec<&'a mut [f32]>,
}

multiversion! {
    /// Depthwise causal conv of one lane and SiLU: `taps` is `[kernel][conv_dim]` (tap-major, so
    /// every loop runs along the channels), `hist` the previous `kernel − 1` inputs oldest first.
    /// Per channel: `w[last]·x`, then `+ w[j]·hist[j]` in order of `j`, then SiLU.
    fn conv_silu(taps: &[f32], hist: &[f32], x: &[f32], y: &mut [f32]) = conv_silu_body {
        let cd = x.len();
        let last = &taps[taps.len() - cd..];
        for ((y, &w), &x) in y.iter_mut().zip(last).zip(x) {
            *y = w * x;
        }
        for (h, w) in hist.chunks_exact(cd).zip(taps.chunks_exact(cd)) {
            for ((y, &w), &h) in y.iter_mut().zip(w).zip(h) {
                *y += w * h;
            }
        }
        for y in y.iter_mut() {
            *y = silu(*y);
        }
    }
}

// The delta rule on one head's state S (`[dk][dv]`, row i belongs to key channel i) for one
// token: decay `S ← g·S`, `u = Sᵀk`, `δ = β(v − u)`, `S ← S + k·δᵀ`, readout `o = Sᵀq`. The
// stored state never holds the decay of the token to come: each pass multiplies by it on the
// way (`g·S` rounded to f32, then used), so a decode token reads S twice and writes it once, and
// consecutive tokens of a session can share a pass (see `GatedDeltaNet::forward`). Every element
// sees the same operations in the same order either way.

multiversion! {
    /// First pass of a token, read-only: `u = (decay·S)ᵀk`.
    fn project(sm: &[f32], k: &[f32], decay: f32, u: &mut [f32]) = project_body {
        let dv = u.len();
        u.fill(0.0);
        for (row, &ki) in sm.chunks_exact(dv).zip(k) {
            for (&sij, uj) in row.iter().zip(u.iter_mut()) {
                *uj += (sij * decay) * ki;
            }
        }
    }
}

multiversion! {
    /// Last pass of a token: `S ← decay·S + k·δᵀ` and `o = Sᵀq`.
    fn update(sm: &mut [f32], decay: f32, k: &[f32], q: &[f32], delta: &[f32], o: &mut [f32]) = update_body {
        let dv = o.len();
        o.fill(0.0);
        for ((row, &ki), &qi) in sm.chunks_exact_mut(dv).zip(k).zip(q) {
            for ((sij, &dj), oj) in row.iter_mut().zip(delta).zip(o.iter_mut()) {
                *sij = *sij * decay + ki * dj;
                *oj += *sij * qi;
            }
        }
    }
}

multiversion! {
    /// [`update`] of one token fused with [`project`] of the session's next token (`next` = its
    /// k and decay, into `u_next`).
    /// `token` is this token's (decay, k, q).
    fn update_then_project(
        sm: &mut [f32],
        token: (f32, &[f32], &[f32]),
        delta: &[f32],
        o: &mut [f32],
        next: (&[f32], f32),
        u_next: &mut [f32],
    ) = update_then_project_body {
        let (decay, k, q) = token;
        let (k_next, decay_next) = next;
        let dv = o.len();
        o.fill(0.0);
        u_next.fill(0.0);
        for (((row, &ki), &qi), &kn) in sm.chunks_exact_mut(dv).zip(k).zip(q).zip(k_next) {
            for (((sij, &dj), oj), un) in row.iter_mut().zip(delta).zip(o.iter_mut()).zip(u_next.iter_mut()) {
                *sij = *sij * decay + ki * dj;
                *oj += *sij * qi;
                *un += (*sij * decay_next) * kn;
            }
        }
    }
}

multiversion! {
    /// Gated RMSNorm of one head's output in place: `rmsnorm(o) ⊙ w ⊙ silu(z)` (mean of squares
    /// summed in f64).
    fn gated_norm(o: &mut [f32], w: &[f32], z: &[f32], eps: f32) = gated_norm_body {
        let ms = o.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() / o.len() as f64;
        let r = 1.0 / (ms as f32 + eps).sqrt();
        for ((oj, &w), &zj) in o.iter_mut().zip(w).zip(z) {
            *oj = (*oj * r) * w * silu(zj);
        }
    }
}

/// x ← x · rsqrt(Σx² + 1e-6) · scale.
fn l2_normalize(x: &mut [f32], scale: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let r = scale / (ss + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= r);
}
