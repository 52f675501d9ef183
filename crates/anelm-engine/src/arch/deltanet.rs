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
        let (cd, hv, dv) = (s.conv_dim(), s.n_v_heads, s.v_dim);
        let stride = Self::lane_len(&s);
        let lanes = lanes.min(self.lanes());
        let recs = || self.data.chunks_exact(stride).take(lanes);
        advance_conv(&mut st.conv, cd, &recs().map(|rec| &rec[..cd]).collect::<Vec<_>>());
        if lanes == 0 {
            return;
        }
        let mut scratch = vec![0.0f32; lanes * dv];
        for (vh, sm) in st.state.chunks_exact_mut(s.k_dim * dv).enumerate() {
            let gates: Vec<(f32, f32)> = recs().map(|rec| (rec[2 * cd + vh], rec[2 * cd + hv + vh])).collect();
            let run = HeadRun::new(&s, order, vh, &self.data[cd..], stride, &gates);
            let mut outs: Vec<&mut [f32]> = scratch.chunks_exact_mut(dv).collect();
            recur(sm, &run, 0..lanes, &mut outs);
        }
    }
}

impl VHeadOrder {
    /// The key head value head `vh` reads, of `hk` key heads and `hv` value heads.
    fn key_head(self, vh: usize, hv: usize, hk: usize) -> usize {
        match self {
            VHeadOrder::Grouped => vh / (hv / hk),
            VHeadOrder::Tiled => vh % hk,
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
        // Each lane's conv reads the `hist` inputs before it: the previous lanes of its session
        // in this step, then (further back) the session's conv history. `by_session[si]` holds
        // session `si`'s lanes in order, `earlier[lane]` the lane's session's lane before it.
        let mut by_session: Vec<Vec<usize>> = vec![Vec::new(); states.len()];
        let mut earlier = vec![None; n];
        for (lane, &si) in lane_state.iter().enumerate() {
            earlier[lane] = by_session[si].last().copied();
            by_session[si].push(lane);
        }
        {
            let states = &*states;
            act.par_lanes_mut(&|lane, y| {
                let conv = &states[lane_state[lane]].conv;
                // The history rows, newest first, then reversed to oldest first.
                let mut rows: Vec<&[f32]> = Vec::with_capacity(hist);
                let mut at = earlier[lane];
                while rows.len() < hist {
                    match at {
                        Some(l) => {
                            rows.push(&proj.lane(l)[..cd]);
                            at = earlier[l];
                        }
                        None => {
                            let back = hist - rows.len();
                            rows.extend(conv[(hist - back) * cd..].rchunks_exact(cd));
                        }
                    }
                }
                rows.reverse();
                conv_silu(&self.conv_taps, &rows, &proj.lane(lane)[..cd], y);
                let (q, k) = y[..2 * kw].split_at_mut(kw);
                for (qh, kh) in q.chunks_mut(dk).zip(k.chunks_mut(dk)) {
                    l2_normalize(qh, qscale);
                    l2_normalize(kh, 1.0);
                }
            });
        }
        // The conv histories move on by each session's lanes in this step.
        for (st, mine) in states.iter_mut().zip(&by_session) {
            let inputs: Vec<&[f32]> = mine.iter().map(|&l| &proj.lane(l)[..cd]).collect();
            advance_conv(&mut st.conv, cd, &inputs);
            if let Some(t) = &mut st.trace {
                for &l in mine {
                    let p = proj.lane(l);
                    t.data.extend_from_slice(&p[..cd]);
                    t.data.extend_from_slice(act.lane(l));
                    t.data.extend((0..hv).map(|vh| sigmoid(p[cd + vw + vh])));
                    t.data.extend((0..hv).map(|vh| self.decay(vh, p[cd + vw + hv + vh])));
                }
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
        let act = &*act;
        anelm_kernels::pool::global().for_each_chunk_mut(&mut jobs, 1, &|vh, job| {
            let Some(job) = job.first_mut() else { return };
            let gates: Vec<(f32, f32)> = (0..n)
                .map(|lane| {
                    let p = proj.lane(lane);
                    (sigmoid(p[cd + vw + vh]), self.decay(vh, p[cd + vw + hv + vh]))
                })
                .collect();
            let run = HeadRun::new(s, self.order, vh, act.as_slice(), cd, &gates);
            // Runs of consecutive lanes of one session share each pass over the state.
            let mut start = 0;
            while start < n {
                let si = lane_state[start];
                let end = start + lane_state[start..].iter().take_while(|&&x| x == si).count();
                recur(&mut *job.states[si], &run, start..end, &mut job.outs[start..end]);
                for lane in start..end {
                    let z = &proj.lane(lane)[cd + vh * dv..cd + (vh + 1) * dv];
                    gated_norm(&mut *job.outs[lane], &self.norm_w, z, self.eps);
                }
                start = end;
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
    fn conv_silu(taps: &[f32], hist: &[&[f32]], x: &[f32], y: &mut [f32]) = conv_silu_body {
        let cd = x.len();
        let last = &taps[taps.len() - cd..];
        for ((y, &w), &x) in y.iter_mut().zip(last).zip(x) {
            *y = w * x;
        }
        for (h, w) in hist.iter().zip(taps.chunks_exact(cd)) {
            for ((y, &w), &h) in y.iter_mut().zip(w).zip(h.iter()) {
                *y += w * h;
            }
        }
        for y in y.iter_mut() {
            *y = silu(*y);
        }
    }
}

/// One value head's inputs to the recurrence over the lanes of a step: each lane's q, k and v
/// (q and k normalised) at fixed offsets in rows of `stride` floats of `x`, and its (β, decay).
struct HeadRun<'a> {
    x: &'a [f32],
    stride: usize,
    q_at: usize,
    k_at: usize,
    v_at: usize,
    dk: usize,
    dv: usize,
    gates: &'a [(f32, f32)],
}

impl<'a> HeadRun<'a> {
    /// Value head `vh` of a layer of shape `s`: each lane's `[q | k | v]` conv output (q and k
    /// normalised) at the start of a row of `stride` floats of `x`, and its (β, decay).
    fn new(
        s: &DeltaNetShape,
        order: VHeadOrder,
        vh: usize,
        x: &'a [f32],
        stride: usize,
        gates: &'a [(f32, f32)],
    ) -> Self {
        let (dk, dv, kw) = (s.k_dim, s.v_dim, s.key_width());
        let kh = order.key_head(vh, s.n_v_heads, s.n_k_heads);
        Self {
            x,
            stride,
            q_at: kh * dk,
            k_at: kw + kh * dk,
            v_at: 2 * kw + vh * dv,
            dk,
            dv,
            gates,
        }
    }

    #[inline(always)]
    fn q(&self, lane: usize) -> &[f32] {
        &self.x[lane * self.stride + self.q_at..][..self.dk]
    }
    #[inline(always)]
    fn k(&self, lane: usize) -> &[f32] {
        &self.x[lane * self.stride + self.k_at..][..self.dk]
    }
    #[inline(always)]
    fn v(&self, lane: usize) -> &[f32] {
        &self.x[lane * self.stride + self.v_at..][..self.dv]
    }
}

// The delta rule on one head's state S (`[dk][dv]`, row i belongs to key channel i) for one
// token: decay `S ← g·S`, `u = Sᵀk`, `δ = β(v − u)`, `S ← S + k·δᵀ`, readout `o = Sᵀq`. The
// stored state never holds the decay of the token to come: each pass applies it on the way, so a
// decode token reads S twice and writes it once, and consecutive tokens of a session share a
// pass (the update of one with the projection of the next). Per element, with fused
// multiply-adds: `u += s·(g·kᵢ)`, `s ← fma(s, g, kᵢ·δ)`, `o += s·qᵢ` — four operations of the
// FMA pipes per element and token (eight multiplies and adds unfused). Every value channel
// (column j of S) is independent of the others, so the passes run a block of columns at a time
// over all the run's tokens: the block (dk × 32 or 64 floats) stays in the core's L1 cache and its
// sums in registers for the whole run. Every element sees the same operations in the same order
// whatever the blocking, the run's length or the ISA (`mul_add` is one correctly rounded fma
// everywhere: the hardware's in the AVX2/AVX-512 copies and on aarch64, the C library's in the
// baseline x86-64 copy), so the bits do not depend on how a prompt is split into steps.

/// Value channels a block pass keeps in registers: its δ, o and u sums are 3·W floats (24 of
/// NEON's 32 registers at 16, 12 of AVX2's 16 at 32); `recur` takes 64 with AVX-512.
#[cfg(target_arch = "aarch64")]
const BLOCK: usize = 16;
#[cfg(not(target_arch = "aarch64"))]
const BLOCK: usize = 32;

/// Lanes a block pass walks before the next block: their q, k and v (~1.5 KB a lane) stay in L2
/// between the passes over one state's column blocks.
const SUB_RUN: usize = 64;

multiversion! {
    /// The delta rule over `lanes` (consecutive tokens of one session) on that session's state
    /// `sm` of one value head: each lane's readout into `outs[lane − lanes.start]`.
    fn recur(sm: &mut [f32], run: &HeadRun<'_>, lanes: std::ops::Range<usize>, outs: &mut [&mut [f32]]) = recur_body {
        // Between sub-runs, each column's u of the next token (the sub-run's last pass made it).
        let mut carry = vec![0.0f32; if lanes.len() > SUB_RUN { run.dv } else { 0 }];
        // 64 channels a block with AVX-512's 32 registers (12 of them for the sums): the
        // per-row broadcasts of k, q and g'·k' shared by twice the columns (~10 % off a layer,
        // `benches/deltanet.rs`, field guide 2026-12-08).
        let wide512 = crate::wide::width() == crate::wide::Width::Avx512;
        let mut first = lanes.start;
        while first < lanes.end {
            let sub = first..(first + SUB_RUN).min(lanes.end);
            let outs = &mut outs[first - lanes.start..];
            let mut c = 0;
            while c < run.dv {
                let left = run.dv - c;
                let carry = carry.get_mut(c..).unwrap_or_default();
                let pass = Pass { run, sub: sub.clone(), end: lanes.end, primed: first > lanes.start, c };
                c += if left >= 64 && wide512 {
                    columns::<64>(sm, &pass, carry, outs)
                } else if left >= BLOCK {
                    columns::<BLOCK>(sm, &pass, carry, outs)
                } else if left >= 8 {
                    columns::<8>(sm, &pass, carry, outs)
                } else {
                    columns::<1>(sm, &pass, carry, outs)
                };
            }
            first = sub.end;
        }
    }
}

/// One block pass of [`recur`]: the lanes `sub` of a run that ends at `end`, from column `c`;
/// `primed` when an earlier sub-run left the first lane's u in the carry.
struct Pass<'a, 'b> {
    run: &'b HeadRun<'a>,
    sub: std::ops::Range<usize>,
    end: usize,
    primed: bool,
    c: usize,
}

/// [`recur`] on the `W` value channels from column `p.c` over the lanes `p.sub` (`outs[0]` is
/// the first's readout); `carry` holds u of the first lane when primed and receives u of the
/// lane after the last when the run goes on. Returns `W`.
#[inline(always)]
fn columns<const W: usize>(sm: &mut [f32], p: &Pass<'_, '_>, carry: &mut [f32], outs: &mut [&mut [f32]]) -> usize {
    let (run, c) = (p.run, p.c);
    let dv = run.dv;
    let mut u = [0.0f32; W];
    if p.primed {
        u.copy_from_slice(&carry[..W]);
    } else if let Some(&(_, g0)) = run.gates.get(p.sub.start) {
        // u = (g·S)ᵀk of the run's first token.
        for (row, &ki) in sm.chunks_exact(dv).zip(run.k(p.sub.start)) {
            let (row, gk) = (&row[c..c + W], g0 * ki);
            for j in 0..W {
                u[j] = row[j].mul_add(gk, u[j]);
            }
        }
    }
    for (lane, o_out) in p.sub.clone().zip(outs.iter_mut()) {
        let (beta, g) = run.gates[lane];
        let (q, k, v) = (run.q(lane), run.k(lane), run.v(lane));
        // δ = β(v − u).
        let mut d = [0.0f32; W];
        for ((dj, &vj), &uj) in d.iter_mut().zip(&v[c..c + W]).zip(&u) {
            *dj = (vj - uj) * beta;
        }
        let mut o = [0.0f32; W];
        if lane + 1 < p.end {
            // S ← g·S + k·δᵀ, o = Sᵀq, and the next token's u = (g'·S)ᵀk' in the same pass.
            let (_, gn) = run.gates[lane + 1];
            let mut un = [0.0f32; W];
            for (((row, &ki), &qi), &kn) in sm.chunks_exact_mut(dv).zip(k).zip(q).zip(run.k(lane + 1)) {
                let (row, gk) = (&mut row[c..c + W], gn * kn);
                for j in 0..W {
                    let s = row[j].mul_add(g, ki * d[j]);
                    row[j] = s;
                    o[j] = s.mul_add(qi, o[j]);
                    un[j] = s.mul_add(gk, un[j]);
                }
            }
            u = un;
        } else {
            for ((row, &ki), &qi) in sm.chunks_exact_mut(dv).zip(k).zip(q) {
                let row = &mut row[c..c + W];
                for j in 0..W {
                    let s = row[j].mul_add(g, ki * d[j]);
                    row[j] = s;
                    o[j] = s.mul_add(qi, o[j]);
                }
            }
        }
        o_out[c..c + W].copy_from_slice(&o);
    }
    if p.sub.end < p.end {
        carry[..W].copy_from_slice(&u);
    }
    W
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

/// A conv history (the last `kernel − 1` inputs of `cd` channels, oldest first) moved on by
/// `inputs`, a session's newer inputs in order.
fn advance_conv(conv: &mut [f32], cd: usize, inputs: &[&[f32]]) {
    let hist = conv.len().checked_div(cd).unwrap_or(0);
    let fresh = inputs.len().min(hist);
    if fresh == 0 {
        return;
    }
    let keep = hist - fresh;
    conv.copy_within(fresh * cd.., 0);
    for (row, input) in conv[keep * cd..]
        .chunks_exact_mut(cd)
        .zip(&inputs[inputs.len() - fresh..])
    {
        row.copy_from_slice(input);
    }
}

/// x ← x · rsqrt(Σx² + 1e-6) · scale.
fn l2_normalize(x: &mut [f32], scale: f32) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let r = scale / (ss + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= r);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1).
    fn noise(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The delta rule one token at a time, pass after pass as the module's doc states it
    /// (project, then update and readout), with the same per-element operations as `columns`.
    fn textbook(sm: &mut [f32], run: &HeadRun<'_>, lane: usize, o: &mut [f32]) {
        let (dk, dv) = (run.dk, run.dv);
        let (beta, g) = run.gates[lane];
        let (q, k, v) = (run.q(lane), run.k(lane), run.v(lane));
        let mut u = vec![0.0f32; dv];
        for i in 0..dk {
            for j in 0..dv {
                u[j] = sm[i * dv + j].mul_add(g * k[i], u[j]);
            }
        }
        let d: Vec<f32> = (0..dv).map(|j| (v[j] - u[j]) * beta).collect();
        o.fill(0.0);
        for i in 0..dk {
            for j in 0..dv {
                let s = sm[i * dv + j].mul_add(g, k[i] * d[j]);
                sm[i * dv + j] = s;
                o[j] = s.mul_add(q[i], o[j]);
            }
        }
    }

    /// `recur` over runs of two sessions' lanes (longer than a sub-run, value widths that take
    /// every block size) gives the textbook's state and readouts bit for bit.
    #[test]
    fn recur_is_the_textbook_rule_bit_for_bit() {
        for (dk, dv) in [(24, 40), (16, 128), (8, 7), (12, 100)] {
            let (n, stride) = (160, 2 * dk + dv);
            let x = noise(dk as u64 * 31 + dv as u64, n * stride);
            let gates: Vec<(f32, f32)> = noise(7, 2 * n)
                .chunks_exact(2)
                .map(|p| (0.5 + 0.5 * p[0], 0.9 + 0.1 * p[1]))
                .collect();
            let run = HeadRun {
                x: &x,
                stride,
                q_at: 0,
                k_at: dk,
                v_at: 2 * dk,
                dk,
                dv,
                gates: &gates,
            };
            // Session 0: lanes 0..70 and 73..160; session 1: lanes 70..73.
            let runs = [(0usize, 0..70), (1, 70..73), (0, 73..n)];
            let start = [noise(1, dk * dv), noise(2, dk * dv)];
            type Kernel = fn(&mut [f32], &HeadRun<'_>, std::ops::Range<usize>, &mut [&mut [f32]]);
            let through = |kernel: Kernel| {
                let mut states = start.clone();
                let mut outs = vec![0.0f32; n * dv];
                for (si, lanes) in runs.iter().cloned() {
                    let mut o: Vec<&mut [f32]> = outs[lanes.start * dv..lanes.end * dv].chunks_exact_mut(dv).collect();
                    kernel(&mut states[si], &run, lanes, &mut o);
                }
                (states, outs)
            };
            let (states, outs) = through(recur);
            let mut want_states = start.clone();
            let mut want = vec![0.0f32; n * dv];
            for (si, lanes) in runs.iter().cloned() {
                for lane in lanes {
                    textbook(&mut want_states[si], &run, lane, &mut want[lane * dv..(lane + 1) * dv]);
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&outs), bits(&want), "readouts, dk {dk} dv {dv}");
            // The baseline copy (software fma on x86-64 without AVX2) gives the same bits.
            let (base, base_outs) = through(recur_body);
            assert_eq!(bits(&base_outs), bits(&outs), "baseline copy, dk {dk} dv {dv}");
            assert_eq!(base, states, "baseline copy's states, dk {dk} dv {dv}");
            for (got, want) in states.iter().zip(&want_states) {
                assert_eq!(bits(got), bits(want), "states, dk {dk} dv {dv}");
            }
        }
    }

    fn layer(shape: DeltaNetShape, order: VHeadOrder) -> GatedDeltaNet {
        let (cd, kk, hv) = (shape.conv_dim(), shape.conv_kernel, shape.n_v_heads);
        GatedDeltaNet::new(
            shape,
            noise(11, cd * kk).iter().map(|w| 0.5 * w).collect(),
            noise(12, hv).iter().map(|a| -(0.5 + 0.4 * a).exp()).collect(),
            noise(13, hv),
            noise(14, shape.v_dim).iter().map(|w| 1.0 + 0.1 * w).collect(),
            1e-6,
            order,
        )
        .expect("a valid layer")
    }

    /// A prompt through the layer in one step, in steps of uneven sizes, or one token at a time
    /// gives the same outputs and the same state bit for bit; a speculative pass's trace
    /// replayed over its first lanes gives the state of a pass over those lanes alone.
    #[test]
    fn outputs_and_state_do_not_depend_on_the_steps() {
        let shape = DeltaNetShape {
            n_k_heads: 2,
            n_v_heads: 4,
            k_dim: 16,
            v_dim: 40,
            conv_kernel: 4,
        };
        for order in [VHeadOrder::Grouped, VHeadOrder::Tiled] {
            let l = layer(shape, order);
            let n = 150;
            let proj = Batch::from_vec(n, shape.proj_width(), noise(21, n * shape.proj_width())).expect("sizes");
            let through = |steps: &[usize]| {
                let mut st = shape.new_state();
                let (mut act, mut out, mut all) = (Batch::zeros(0, 0), Batch::zeros(0, 0), Vec::new());
                let mut at = 0;
                for &len in steps {
                    let part = Batch::from_vec(
                        len,
                        proj.channels(),
                        proj.as_slice()[at * proj.channels()..(at + len) * proj.channels()].to_vec(),
                    )
                    .expect("sizes");
                    l.forward(&mut [&mut st], &vec![0; len], &part, &mut act, &mut out)
                        .expect("forward");
                    all.extend(out.as_slice().iter().map(|x| x.to_bits()));
                    at += len;
                }
                let state: Vec<u32> = st.state.iter().chain(&st.conv).map(|x| x.to_bits()).collect();
                (all, state)
            };
            let whole = through(&[n]);
            assert!(whole.0.iter().all(|&b| f32::from_bits(b).is_finite()));
            assert_eq!(through(&[37, 1, 90, 22]), whole, "{order:?}: uneven steps");
            assert_eq!(through(&vec![1; n]), whole, "{order:?}: one token at a time");

            // A traced pass over the first 9 lanes, replayed over 5, leaves the state of 5.
            let mut traced = shape.new_state();
            traced.trace = Some(LaneTrace::default());
            let before = traced.clone();
            let part =
                Batch::from_vec(9, proj.channels(), proj.as_slice()[..9 * proj.channels()].to_vec()).expect("sizes");
            let (mut act, mut out) = (Batch::zeros(0, 0), Batch::zeros(0, 0));
            l.forward(&mut [&mut traced], &[0; 9], &part, &mut act, &mut out)
                .expect("forward");
            let trace = traced.trace.take().expect("a trace");
            assert_eq!(trace.lanes(), 9);
            let mut replayed = before;
            replayed.trace = None;
            trace.replay(&mut replayed, 5);
            let five = through(&[5]).1;
            let got: Vec<u32> = replayed
                .state
                .iter()
                .chain(&replayed.conv)
                .map(|x| x.to_bits())
                .collect();
            assert_eq!(got, five, "{order:?}: replay of 5 of 9 lanes");
        }
    }

    /// Two sessions' lanes interleaved in one step give each session what it gets alone.
    #[test]
    fn interleaved_sessions_do_not_mix() {
        let shape = DeltaNetShape {
            n_k_heads: 1,
            n_v_heads: 2,
            k_dim: 8,
            v_dim: 12,
            conv_kernel: 4,
        };
        let l = layer(shape, VHeadOrder::Grouped);
        let w = shape.proj_width();
        let (a, b) = (noise(31, 7 * w), noise(32, 2 * w));
        // Step lanes: a0 b0 a1 a2 b1 a3 a4 a5 a6.
        let order = [(0, 0), (1, 0), (0, 1), (0, 2), (1, 1), (0, 3), (0, 4), (0, 5), (0, 6)];
        let mixed: Vec<f32> = order
            .iter()
            .flat_map(|&(si, i)| {
                if si == 0 {
                    &a[i * w..(i + 1) * w]
                } else {
                    &b[i * w..(i + 1) * w]
                }
            })
            .copied()
            .collect();
        let lane_state: Vec<usize> = order.iter().map(|&(si, _)| si).collect();
        let (mut sa, mut sb) = (shape.new_state(), shape.new_state());
        let (mut act, mut out) = (Batch::zeros(0, 0), Batch::zeros(0, 0));
        let proj = Batch::from_vec(order.len(), w, mixed).expect("sizes");
        l.forward(&mut [&mut sa, &mut sb], &lane_state, &proj, &mut act, &mut out)
            .expect("forward");
        for (si, data, st) in [(0, &a, &sa), (1, &b, &sb)] {
            let lanes = data.len() / w;
            let mut alone = shape.new_state();
            let (mut act1, mut out1) = (Batch::zeros(0, 0), Batch::zeros(0, 0));
            let p = Batch::from_vec(lanes, w, data.clone()).expect("sizes");
            l.forward(&mut [&mut alone], &vec![0; lanes], &p, &mut act1, &mut out1)
                .expect("forward");
            assert_eq!(&alone, st, "session {si}'s state");
            let mine: Vec<f32> = (0..order.len())
                .filter(|&lane| lane_state[lane] == si)
                .flat_map(|lane| out.lane(lane).to_vec())
                .collect();
            assert_eq!(mine, out1.as_slice(), "session {si}'s outputs");
        }
    }
}
