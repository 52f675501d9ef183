//! The model planner: which ANE kernels each layer gets, and why (`anelm plan`).
//!
//! From a model's shapes alone (no weights) it chooses, per layer, the kernels of
//! `ane-runtime.md` §3.4–3.5 — a fused input projection, the output projection with the
//! residual add, and the SwiGLU FFN with the residual add (split into accumulating chunks when
//! one kernel would exceed the FFN size limit) — plus the LM head in row chunks, and models the
//! cost of one decode step as `Σ (fixed + bytes / bandwidth)` over its dispatches.

use std::fmt::{self, Write as _};

use thiserror::Error;

use crate::chip::ChipProfile;
use crate::kernel::{AneKernel, WeightMode};
use crate::limits::Limits;
use crate::plan_host::HostOptions;
use crate::plan_input::{ModelKernel, ModelKernels, ModelLayer};
use crate::surface::LANES;

/// Gated-DeltaNet (linear attention) dimensions of a hybrid model such as Qwen3.5.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearAttention {
    /// `linear_num_key_heads`.
    pub key_heads: usize,
    /// `linear_num_value_heads`.
    pub value_heads: usize,
    /// `linear_key_head_dim`.
    pub key_head_dim: usize,
    /// `linear_value_head_dim`.
    pub value_head_dim: usize,
}

/// Sliding-window (local) attention layers, as Gemma 3 has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    /// Positions a local layer attends to.
    pub window: usize,
}

/// How a decoder block joins its mixer and FFN to the residual stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockLayout {
    /// Pre-norm (Llama, Qwen3, Qwen3.5): the residual adds run on the ANE inside the output
    /// projection and the SwiGLU FFN kernels.
    PreNorm,
    /// Gemma 3: the attention and FFN outputs are normalised before they join the residual, so
    /// the output and down projections are plain kernels, the GeGLU runs on the host between the
    /// fused gate ‖ up projection and the down projection, and the host adds the residuals.
    Sandwich,
}

/// The shapes the planner needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelDims {
    /// `hidden_size`.
    pub hidden: usize,
    /// `intermediate_size` (SwiGLU width).
    pub intermediate: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Attention head dimension.
    pub head_dim: usize,
    /// Vocabulary rows of the LM head.
    pub vocab: usize,
    /// Decoder layers.
    pub layers: usize,
    /// `q_proj` also emits an output gate (Qwen3.5 full attention: 2·heads·head_dim rows).
    pub attn_output_gate: bool,
    /// Gated-DeltaNet layers, for hybrid models.
    pub linear_attention: Option<LinearAttention>,
    /// Local attention layers, for Gemma 3.
    pub sliding_window: Option<SlidingWindow>,
    /// How the block joins the residual stream.
    pub block: BlockLayout,
}

impl ModelDims {
    /// A plain transformer (Llama / Qwen3 style): every layer is attention.
    pub fn dense(
        hidden: usize,
        intermediate: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        vocab: usize,
        layers: usize,
    ) -> Self {
        ModelDims {
            hidden,
            intermediate,
            heads,
            kv_heads,
            head_dim,
            vocab,
            layers,
            attn_output_gate: false,
            linear_attention: None,
            sliding_window: None,
            block: BlockLayout::PreNorm,
        }
    }
}

/// The mixer of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// Softmax attention (on the CPU between the projections).
    Attention,
    /// Gated DeltaNet (on the CPU between the projections).
    LinearAttention,
    /// Softmax attention over a sliding window (Gemma 3 local layers).
    SlidingAttention,
    /// A gated short convolution (LFM2): `B ⊙ x` through a depthwise causal conv of a few taps,
    /// gated by `C`, on the CPU between the in and out projections.
    ShortConv,
}

impl LayerKind {
    /// `layers` layers where every `n`-th (`(i + 1) % n == 0`) is `nth` and the rest `others`:
    /// how hybrid and sliding-window models are usually laid out (Qwen3.5: three DeltaNet
    /// layers then one attention layer; Gemma 3: five local layers then one global), for
    /// models described by hand.
    pub fn every_nth(layers: usize, n: usize, nth: LayerKind, others: LayerKind) -> Vec<LayerKind> {
        let n = n.max(1);
        (0..layers)
            .map(|i| if (i + 1) % n == 0 { nth } else { others })
            .collect()
    }

    /// `attention` / `linear-attention`.
    pub fn name(self) -> &'static str {
        match self {
            LayerKind::Attention => "attention",
            LayerKind::LinearAttention => "linear-attention",
            LayerKind::SlidingAttention => "sliding-attention",
            LayerKind::ShortConv => "short-conv",
        }
    }
}

/// What a planned kernel is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelRole {
    /// Fused input projection (QKV, or QKVZ for DeltaNet).
    InputProj,
    /// Output projection + residual.
    OutputProjResidual,
    /// Plain output projection (Gemma 3: normalised on the host before the residual add).
    OutputProj,
    /// Fused gate ‖ up projection (Gemma 3: GeGLU on the host).
    FfnGateUp,
    /// Plain down projection (Gemma 3).
    FfnDown,
    /// Whole SwiGLU FFN + residual.
    FfnResidual,
    /// Plain up projection (BERT: bias and GELU on the host).
    FfnUp,
    /// Down projection + residual (BERT).
    FfnDownResidual,
    /// Chunk `index` of `count` of a split FFN.
    FfnChunk {
        /// 0-based chunk.
        index: usize,
        /// Chunks.
        count: usize,
    },
    /// Chunk `index` of `count` of the LM head.
    LmHead {
        /// 0-based chunk.
        index: usize,
        /// Chunks.
        count: usize,
    },
}

impl fmt::Display for KernelRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelRole::InputProj => f.write_str("input_proj"),
            KernelRole::OutputProjResidual => f.write_str("output_proj_residual"),
            KernelRole::OutputProj => f.write_str("output_proj"),
            KernelRole::FfnGateUp => f.write_str("ffn_gate_up"),
            KernelRole::FfnDown => f.write_str("ffn_down"),
            KernelRole::FfnResidual => f.write_str("ffn_residual"),
            KernelRole::FfnUp => f.write_str("ffn_up"),
            KernelRole::FfnDownResidual => f.write_str("ffn_down_residual"),
            KernelRole::FfnChunk { index, count } => write!(f, "ffn_chunk {}/{count}", index + 1),
            KernelRole::LmHead { index, count } => write!(f, "lm_head {}/{count}", index + 1),
        }
    }
}

/// One kernel choice and the reason for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedKernel {
    /// What it is for.
    pub role: KernelRole,
    /// The kernel.
    pub kernel: AneKernel,
    /// Why this kernel (human-readable; printed by `anelm plan`).
    pub reason: String,
}

/// The kernels of one layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerPlan {
    /// Layer index.
    pub index: usize,
    /// Its mixer.
    pub kind: LayerKind,
    /// Kernels in dispatch order.
    pub kernels: Vec<PlannedKernel>,
}

/// Planner settings: the weight storage and the device's limits.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PlanOptions {
    /// Weight storage.
    pub weights: WeightMode,
    /// The device's limits and the planner's size choices under them.
    pub limits: Limits,
}

impl PlanOptions {
    /// Defaults with weights stored as `weights`.
    pub fn with_weights(weights: WeightMode) -> Self {
        PlanOptions {
            weights,
            ..PlanOptions::default()
        }
    }
}

/// A model cannot be planned onto the ANE.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanError {
    /// A dimension is zero or inconsistent.
    #[error("cannot plan this model: {0}; check the model's config")]
    BadDims(String),
    /// A kernel cannot be made to fit the device limits.
    #[error("cannot fit {0} on the ANE; raise the device limits or run this part on the CPU")]
    DoesNotFit(String),
}

/// The kernels of a whole model.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The shapes planned.
    pub dims: ModelDims,
    /// The settings used.
    pub options: PlanOptions,
    /// Per-layer kernels.
    pub layers: Vec<LayerPlan>,
    /// LM-head chunks.
    pub lm_head: Vec<PlannedKernel>,
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// Plan a model described by hand — its shapes and each layer's mixer — onto the ANE: the
/// kernels [`ModelDims::kernels`] derives from them.
pub fn plan(dims: &ModelDims, kinds: &[LayerKind], opts: &PlanOptions) -> Result<Plan, PlanError> {
    plan_model(&dims.kernels(kinds), opts)
}

/// Plan a model's kernels onto the ANE: each layer's kernels as the model compiles them (an FFN
/// over the size limit split into accumulating chunks), the LM head in row chunks, every piece
/// checked against the device limits.
pub fn plan_model(model: &ModelKernels, opts: &PlanOptions) -> Result<Plan, PlanError> {
    let dims = &model.dims;
    check(dims)?;
    if model.layers.len() != dims.layers {
        return Err(PlanError::BadDims(format!(
            "the kernel list has {} layers but the model has {}",
            model.layers.len(),
            dims.layers
        )));
    }
    let mut layers = Vec::with_capacity(dims.layers);
    // Layers with the same kernels get the same plan: plan each once.
    let mut planned: Vec<(&ModelLayer, Vec<PlannedKernel>)> = Vec::new();
    for (i, layer) in model.layers.iter().enumerate() {
        // Each layer's mixer is the kernel list's: any order of kinds plans, as long as the
        // shapes its host work needs are there.
        let kind = layer.kind;
        let missing = match kind {
            LayerKind::LinearAttention => dims.linear_attention.is_none().then_some("DeltaNet sizes"),
            LayerKind::SlidingAttention => dims.sliding_window.is_none().then_some("a sliding window"),
            LayerKind::Attention | LayerKind::ShortConv => None,
        };
        if let Some(what) = missing {
            return Err(PlanError::BadDims(format!(
                "layer {i} is {} but the model's shapes have no {what}",
                kind.name()
            )));
        }
        let kernels = match planned.iter().find(|(l, _)| *l == layer) {
            Some((_, ks)) => ks.clone(),
            None => {
                let ks = plan_layer(dims, layer, opts)?;
                for k in &ks {
                    fits(&k.kernel, opts)?;
                }
                planned.push((layer, ks.clone()));
                ks
            }
        };
        layers.push(LayerPlan {
            index: i,
            kind,
            kernels,
        });
    }
    let lm_head = lm_head(&model.lm_head, opts)?;
    for k in &lm_head {
        fits(&k.kernel, opts)?;
    }
    Ok(Plan {
        dims: *dims,
        options: *opts,
        layers,
        lm_head,
    })
}

fn check(d: &ModelDims) -> Result<(), PlanError> {
    let named = [
        ("hidden", d.hidden),
        ("intermediate", d.intermediate),
        ("heads", d.heads),
        ("kv_heads", d.kv_heads),
        ("head_dim", d.head_dim),
        ("vocab", d.vocab),
        ("layers", d.layers),
    ];
    if let Some((n, _)) = named.iter().find(|(_, v)| *v == 0) {
        return Err(PlanError::BadDims(format!("{n} is 0")));
    }
    if d.heads % d.kv_heads != 0 {
        return Err(PlanError::BadDims(format!(
            "{} query heads are not a multiple of {} kv heads",
            d.heads, d.kv_heads
        )));
    }
    if let Some(la) = d.linear_attention {
        if la.key_heads == 0 || la.value_heads == 0 || la.key_head_dim == 0 || la.value_head_dim == 0 {
            return Err(PlanError::BadDims("a linear-attention dimension is 0".into()));
        }
    }
    if let Some(sw) = d.sliding_window {
        if sw.window == 0 {
            return Err(PlanError::BadDims("the sliding window is 0".into()));
        }
    }
    Ok(())
}

/// One layer's kernels, each with the reason for it; the FFN split when it must be.
fn plan_layer(d: &ModelDims, layer: &ModelLayer, opts: &PlanOptions) -> Result<Vec<PlannedKernel>, PlanError> {
    let mut out = Vec::with_capacity(layer.kernels.len());
    for k in &layer.kernels {
        let planned = |reason: String| PlannedKernel {
            role: k.role,
            kernel: k.kernel.clone(),
            reason,
        };
        match (k.role, &k.kernel) {
            (KernelRole::InputProj, AneKernel::FusedLinear { parts, .. }) => {
                out.push(planned(input_proj_reason(d, layer.kind, parts)));
            }
            (KernelRole::OutputProjResidual, AneKernel::LinearResidual { rows, cols }) => out.push(planned(format!(
                "output projection ({rows}×{cols}) with the residual add in the same program: the residual never \
                 round-trips through the host (no norm fused: fp16 RMSNorm on the ANE drifts)"
            ))),
            (KernelRole::OutputProj, AneKernel::Linear { rows, cols }) => out.push(planned(format!(
                "output projection ({rows}×{cols}) alone: the block normalises the attention output before the \
                 residual add, and a norm stays on the host (fp16 RMSNorm on the ANE drifts)"
            ))),
            (KernelRole::FfnResidual, AneKernel::SwiGluFfnResidual { hidden, inter }) => {
                out.extend(plan_ffn(*hidden, *inter, &opts.limits)?);
            }
            (KernelRole::FfnGateUp, AneKernel::FusedLinear { parts, .. }) => {
                let f = parts.first().copied().unwrap_or(0);
                out.push(planned(format!(
                    "gate and up ({f} rows each) read the same normed input: one conv program with a channel \
                     concat; the GeGLU (tanh GELU) between them and the down projection runs on the host"
                )));
            }
            (KernelRole::FfnDown, AneKernel::Linear { rows, cols }) => {
                if *cols > opts.limits.max_conv_input_channels {
                    return Err(PlanError::DoesNotFit(format!(
                        "the down projection: it reads {cols} channels, over the conv input cap of {}",
                        opts.limits.max_conv_input_channels
                    )));
                }
                out.push(planned(format!(
                    "down projection ({rows}×{cols}) alone: the FFN output is normalised on the host before the \
                     residual add"
                )));
            }
            (role, kernel) => {
                return Err(PlanError::BadDims(format!(
                    "a {role} kernel shaped {kernel}: the planner knows no such kernel in a layer"
                )));
            }
        }
    }
    Ok(out)
}

fn input_proj_reason(d: &ModelDims, kind: LayerKind, parts: &[usize]) -> String {
    match (kind, parts) {
        (LayerKind::ShortConv, &[bcx]) => {
            format!("in_proj ({bcx} rows: the B and C gates and the conv input, one matrix in the file): 1 dispatch")
        }
        (LayerKind::LinearAttention, &[qkv, z, b, _]) => {
            let k = qkv.saturating_sub(z) / 2;
            format!(
                "in_proj_qkv ({qkv} = 2·{k} + {z} rows), in_proj_z ({z}) and the gates in_proj_b, in_proj_a ({b} \
                 each) read the same normed input, so they are one conv program with a channel concat: 1 dispatch \
                 instead of 4 (the loader fuses all four)"
            )
        }
        (_, &[q, kv, _]) => {
            let gate = if d.attn_output_gate {
                " (query + output gate)"
            } else {
                ""
            };
            format!(
                "q ({q} rows{gate}), k ({kv}) and v ({kv}) projections read the same normed input, so they are one \
                 conv program with a channel concat: 1 dispatch instead of 3"
            )
        }
        (_, &[rows]) => format!(
            "one matrix of {rows} rows in the file (its projections fused there, as Phi-3's q ‖ k ‖ v): 1 dispatch"
        ),
        _ => format!(
            "{} projections read the same normed input: one conv program with a channel concat",
            parts.len()
        ),
    }
}

/// The kernels a SwiGLU FFN of width `hidden` → `inter` → `hidden` becomes under `opts`: one
/// [`AneKernel::SwiGluFfnResidual`], or accumulating [`AneKernel::FfnChunk`]s when one kernel
/// would exceed the FFN limit or the conv input cap. The ANE backend compiles exactly these.
pub fn plan_ffn(hidden: usize, inter: usize, limits: &Limits) -> Result<Vec<PlannedKernel>, PlanError> {
    if hidden == 0 || inter == 0 {
        return Err(PlanError::BadDims(format!("an FFN of {hidden}→{inter} channels")));
    }
    let (h, f) = (hidden, inter);
    let total = 3 * (h as u64) * (f as u64) * 2;
    let limit = limits.ffn_max_bytes.min(limits.max_kernel_const_bytes);
    let conv_ok = |chunk: usize| chunk <= limits.max_conv_input_channels;
    if total <= limit && conv_ok(f) {
        return Ok(vec![PlannedKernel {
            role: KernelRole::FfnResidual,
            kernel: AneKernel::SwiGluFfnResidual { hidden: h, inter: f },
            reason: format!(
                "gate + up + down = 3·{f}·{h}·2 B = {} ≤ the {} FFN limit, so the whole SwiGLU FFN and the residual \
                 add are one kernel",
                mb(total),
                mb(limit)
            ),
        }]);
    }
    if 2 * h > limits.max_dim {
        return Err(PlanError::DoesNotFit(format!(
            "a chunked FFN: its packed x ‖ acc input has {} channels, over the {}-channel cap",
            2 * h,
            limits.max_dim
        )));
    }
    let mut n = total.div_ceil(limit).max(2) as usize;
    while n <= f && (f % n != 0 || !conv_ok(f / n)) {
        n += 1;
    }
    if n > f {
        return Err(PlanError::DoesNotFit(format!("an FFN of width {f}")));
    }
    let chunk = f / n;
    let why = if total > limit {
        format!(
            "gate + up + down = 3·{f}·{h}·2 B = {} > the {} FFN limit, so the FFN is split into {n} chunks of {chunk} \
             rows (the smallest n ≥ ⌈{}/{}⌉ that divides {f})",
            mb(total),
            mb(limit),
            mb(total),
            mb(limit)
        )
    } else {
        format!(
            "the down projection would read {f} channels, over the conv input cap of {}, so the FFN is split into {n} \
             chunks of {chunk}",
            limits.max_conv_input_channels
        )
    };
    Ok((0..n)
        .map(|index| PlannedKernel {
            role: KernelRole::FfnChunk { index, count: n },
            kernel: AneKernel::FfnChunk { hidden: h, chunk },
            reason: if index == 0 {
                format!(
                    "{why}; each chunk reads x ‖ acc and adds its partial sum on the ANE (chunk 1 gets the residual \
                     as its accumulator, so the last chunk returns x + FFN(x))"
                )
            } else {
                format!(
                    "chunk {} of {n}: intermediate rows [{}, {})",
                    index + 1,
                    index * chunk,
                    (index + 1) * chunk
                )
            },
        })
        .collect())
}

/// Rows per chunk when a `[_, cols]` matrix is split by rows (the LM head): at most
/// [`Limits::lm_head_max_rows`], the per-op cap, and what fits the kernel size limit.
pub fn linear_chunk_rows(cols: usize, limits: &Limits) -> Result<usize, PlanError> {
    let by_bytes = usize::try_from(limits.max_kernel_const_bytes / (2 * cols.max(1) as u64)).unwrap_or(usize::MAX);
    let rows = limits.lm_head_max_rows.min(limits.max_dim).min(by_bytes);
    if rows == 0 {
        return Err(PlanError::DoesNotFit(format!("a matrix row of width {cols}")));
    }
    Ok(rows)
}

fn lm_head(head: &ModelKernel, opts: &PlanOptions) -> Result<Vec<PlannedKernel>, PlanError> {
    let (v, h) = match (head.role, &head.kernel) {
        (KernelRole::LmHead { .. }, AneKernel::LmHeadChunk { rows, cols }) if *rows > 0 && *cols > 0 => (*rows, *cols),
        (role, kernel) => {
            return Err(PlanError::BadDims(format!(
                "the LM head is described as a {role} kernel shaped {kernel}, not a vocab × hidden matrix"
            )));
        }
    };
    let rows = linear_chunk_rows(h, &opts.limits)?;
    let n = v.div_ceil(rows);
    let cap = if rows == opts.limits.lm_head_max_rows {
        format!("{} rows per chunk (the per-op cap)", opts.limits.lm_head_max_rows)
    } else {
        format!(
            "{rows} rows per chunk (what fits the {} kernel limit)",
            mb(opts.limits.max_kernel_const_bytes)
        )
    };
    Ok((0..n)
        .map(|index| {
            let r = rows.min(v - index * rows);
            PlannedKernel {
                role: KernelRole::LmHead { index, count: n },
                kernel: AneKernel::LmHeadChunk { rows: r, cols: h },
                reason: if n == 1 {
                    format!("vocab {v} ≤ {cap}: one LM-head kernel")
                } else {
                    format!(
                        "vocab {v} at {cap} → {n} chunks; this one is rows [{}, {})",
                        index * rows,
                        index * rows + r
                    )
                },
            }
        })
        .collect())
}

fn fits(k: &AneKernel, opts: &PlanOptions) -> Result<(), PlanError> {
    let bytes = k.fp16_weight_bytes() as u64;
    if bytes > opts.limits.max_kernel_const_bytes {
        return Err(PlanError::DoesNotFit(format!(
            "{k} ({} over the {} kernel limit)",
            mb(bytes),
            mb(opts.limits.max_kernel_const_bytes)
        )));
    }
    let widest = k
        .weights()
        .iter()
        .flat_map(|w| [w.rows, w.cols])
        .chain([k.output_channels()])
        .chain(k.input_channels())
        .max()
        .unwrap_or(0);
    if widest > opts.limits.max_dim {
        return Err(PlanError::DoesNotFit(format!(
            "{k} (a dimension of {widest} > {})",
            opts.limits.max_dim
        )));
    }
    Ok(())
}

impl Plan {
    /// Each layer's mixer, in order.
    pub fn layer_kinds(&self) -> Vec<LayerKind> {
        self.layers.iter().map(|l| l.kind).collect()
    }

    /// Every kernel in dispatch order (layers, then LM head).
    pub fn kernels(&self) -> impl Iterator<Item = &PlannedKernel> {
        self.layers.iter().flat_map(|l| &l.kernels).chain(&self.lm_head)
    }

    /// Kernels to compile and load (one per planned kernel; layers do not share weights).
    pub fn kernel_count(&self) -> usize {
        self.kernels().count()
    }

    /// ANE dispatches per decode step (every kernel runs once per step, for up to 32 lanes).
    pub fn dispatches_per_token(&self) -> usize {
        self.kernel_count()
    }

    /// Weight bytes streamed per decode step, in the plan's weight mode.
    pub fn weight_bytes_per_token(&self) -> u64 {
        self.kernels()
            .map(|k| k.kernel.weight_bytes(self.options.weights) as u64)
            .sum()
    }

    /// All bytes moved per decode step: weights plus every input and output surface.
    pub fn bytes_per_token(&self) -> u64 {
        self.kernels()
            .map(|k| k.kernel.dispatch_bytes(self.options.weights) as u64)
            .sum()
    }

    /// Modelled ANE time of one step (all dispatches), seconds, as the emulator's clock charges
    /// it. Host work (norms, attention, DeltaNet, sampling, surface conversion) is not included;
    /// [`Plan::decode_cost`] adds it.
    pub fn step_seconds(&self, chip: &ChipProfile) -> f64 {
        self.kernels()
            .map(|k| chip.dispatch_seconds(k.kernel.dispatch_bytes(self.options.weights) as u64))
            .sum()
    }

    /// Decode tokens/s from [`Plan::step_seconds`] alone (no host work) with `streams` concurrent
    /// sessions sharing each dispatch's lanes (more than 32 streams take several dispatch groups).
    pub fn ane_decode_tok_s(&self, chip: &ChipProfile, streams: usize) -> f64 {
        let streams = streams.max(1);
        let groups = streams.div_ceil(LANES);
        streams as f64 / (groups as f64 * self.step_seconds(chip))
    }

    /// Modelled decode tokens/s with `streams` concurrent streams: ANE dispatches and host work
    /// ([`Plan::decode_cost`]).
    pub fn decode_tok_s(&self, chip: &ChipProfile, host: &HostOptions, streams: usize) -> f64 {
        self.decode_cost(chip, host, streams).tok_s()
    }

    /// Modelled prefill tokens/s in the runtime's W-lane batches, host work included
    /// ([`Plan::prefill_cost`]).
    pub fn prefill_tok_s(&self, chip: &ChipProfile, host: &HostOptions) -> f64 {
        self.prefill_cost(chip, host).tok_s()
    }

    /// The human-readable table `anelm plan` prints for `chip` with the default host model.
    pub fn report(&self, chip: &ChipProfile) -> String {
        self.report_host(chip, &HostOptions::default())
    }

    /// The human-readable table `anelm plan` prints for `chip` and the host model `host`.
    pub fn report_host(&self, chip: &ChipProfile, host: &HostOptions) -> String {
        let d = &self.dims;
        let mode = self.options.weights;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "model: hidden {}, intermediate {}, heads {}/{} × {}, vocab {}, {} layers; weights {mode}; chip {}",
            d.hidden, d.intermediate, d.heads, d.kv_heads, d.head_dim, d.vocab, d.layers, chip.name
        );
        // Group layers with identical kernels.
        let mut groups: Vec<(&LayerPlan, Vec<usize>)> = Vec::new();
        for l in &self.layers {
            match groups
                .iter_mut()
                .find(|(g, _)| g.kind == l.kind && g.kernels == l.kernels)
            {
                Some((_, idx)) => idx.push(l.index),
                None => groups.push((l, vec![l.index])),
            }
        }
        for (l, idx) in &groups {
            let _ = writeln!(s, "\n{} × {} layer ({}):", idx.len(), l.kind.name(), ranges(idx));
            for k in &l.kernels {
                kernel_line(&mut s, k, mode, chip);
            }
        }
        let _ = writeln!(s, "\nLM head:");
        for k in &self.lm_head {
            kernel_line(&mut s, k, mode, chip);
        }
        let _ = writeln!(
            s,
            "\nkernels: {} · dispatches/token: {} · weight bytes/token: {} · bytes/dispatch (mean): {}",
            self.kernel_count(),
            self.dispatches_per_token(),
            mb(self.weight_bytes_per_token()),
            mb(self.bytes_per_token() / self.dispatches_per_token().max(1) as u64)
        );
        let _ = writeln!(
            s,
            "ANE alone on {} ({:.0} µs + bytes / {:.1} GB/s, as the emulator charges it): step {:.1} ms",
            chip.name,
            chip.fixed_us,
            chip.bandwidth_gb_s,
            self.step_seconds(chip) * 1e3
        );
        let one = self.decode_cost(chip, host, 1);
        let _ = writeln!(
            s,
            "with the host ({} runtime, context {}; int8 weights at {:.2} of the byte rate): step {:.1} ms at 1 \
             stream (ANE {:.1} ms, host {:.1} ms)",
            host.runtime,
            host.context,
            chip.int8_efficiency,
            one.seconds() * 1e3,
            one.ane() * 1e3,
            one.host() * 1e3
        );
        let _ = write!(s, "decode tok/s:");
        for n in [1, 2, 4, 8] {
            let _ = write!(
                s,
                "  {n} stream{}: {:.2}",
                if n == 1 { "" } else { "s" },
                self.decode_tok_s(chip, host, n)
            );
        }
        let _ = writeln!(
            s,
            "\nprefill tok/s ({}-token W-lane batch): {:.2}",
            host.runtime.prefill_lanes(),
            self.prefill_tok_s(chip, host)
        );
        s
    }
}

fn kernel_line(s: &mut String, k: &PlannedKernel, mode: WeightMode, chip: &ChipProfile) {
    let bytes = k.kernel.dispatch_bytes(mode) as u64;
    let _ = writeln!(
        s,
        "  {:<22} {:<44} {:>10}  {:>7.3} ms\n      why: {}",
        k.role.to_string(),
        k.kernel.to_string(),
        mb(bytes),
        chip.dispatch_seconds(bytes) * 1e3,
        k.reason
    );
}

/// `0-2, 4-6, 8` style ranges.
fn ranges(idx: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && idx[j + 1] == idx[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            idx[i].to_string()
        } else {
            format!("{}-{}", idx[i], idx[j])
        });
        i = j + 1;
    }
    out.join(", ")
}
