//! ModernBERT: a pre-norm encoder (the base of gte-modernbert, modernbert-embed and their
//! classifiers), run on the shared decoder trunk with bidirectional attention and loaded as an
//! embedder's trunk only.
//!
//! - Token embeddings then a LayerNorm (no position embeddings: RoPE in every layer).
//! - Per layer: LayerNorm (none before the first layer), fused `Wqkv`, rotate-half RoPE (base
//!   `full_attention` 160 000 / `sliding_attention` 10 000), bidirectional attention — global
//!   layers over the whole input, local ones over `local_attention / 2` positions either side —
//!   `Wo` plus the residual; LayerNorm, `Wi` giving GeGLU's input ‖ gate, `GELU(input) ⊙ gate`,
//!   `Wo` plus the residual.
//! - A final LayerNorm. LayerNorms and linear layers without biases (`norm_bias`, `attention_bias`,
//!   `mlp_bias` false, as the published models have them; a model with biases is refused).
//!
//! For the planner it is a sandwich block (the residual adds and the GeGLU on the host, plain
//! output and down projections, the input ‖ gate projection fused), with local layers as
//! sliding-window attention.

use std::sync::Arc;

use anelm_ane::{BlockLayout, KernelRole, LayerKind, ModelDims, SlidingWindow};
use anelm_model::gguf::GgufFile;
use anelm_model::hf_config::HfConfig;
use anelm_model::tensor_store::TensorStore;
use serde_json::Value;

use crate::arch::attention::Attention;
use crate::arch::config_read::{GgufMeta, check_heads, check_plausible, check_sizes, hf_heads, hf_layer_flags, need};
use crate::arch::decoder::{Decoder, DecoderEnds, DecoderLayers, EndsSpec};
use crate::arch::kernel_compile::CompiledLayer;
use crate::arch::kernel_list::{KernelDesc, KernelList, LayerKernels};
use crate::arch::registry::{self, Architecture, Head};
use crate::arch::step::{LaneRef, lane_angles};
use crate::arch::tensor_names::{Family, LayerTensor, Layout, TensorNames};
use crate::arch::trunk::norm_vector;
use crate::backend::{Backend, ForwardCost, Kernel};
use crate::batch::Batch;
use crate::error::{EngineError, Result};
use crate::model::{ModelInfo, StepItem};
use crate::ops::{AttentionPrecision, Rope, RopePairing, gelu_erf, gelu_tanh, layer_norm};
use crate::session::Session;

/// Hyper-parameters of a ModernBERT encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct ModernBertConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden width.
    pub hidden_size: usize,
    /// GeGLU width.
    pub intermediate_size: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Per layer: true for a local (sliding-window) layer.
    pub local: Vec<bool>,
    /// `local_attention`: the local layers' whole window (half of it either side).
    pub local_attention: usize,
    /// RoPE base of the global layers.
    pub rope_theta_global: f32,
    /// RoPE base of the local layers.
    pub rope_theta_local: f32,
    /// LayerNorm epsilon.
    pub norm_eps: f32,
    /// `gelu` (erf) or the tanh approximation.
    pub gelu_tanh: bool,
    /// Longest input.
    pub context_length: usize,
}

impl ModernBertConfig {
    /// From llama.cpp's `modern-bert` GGUF metadata: the local layers' whole window as
    /// `attention.sliding_window` (`local_attention`, reaching half of it either side), a global
    /// layer every `attention.sliding_window_pattern`-th from the first (llama.cpp's
    /// `dense_first`), the local RoPE base as `rope.freq_base_swa`, the FFN's activation as
    /// `hidden_activation`.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let m = GgufMeta::new(g, "modern-bert");
        let n_layers = m.usize("block_count")?;
        let window = m.opt_usize("attention.sliding_window").unwrap_or(0);
        let gelu_tanh = gelu_is_tanh(g.get_str(&format!("{}.hidden_activation", m.arch())))?;
        // No window: every layer global.
        let local: Vec<bool> = (m.sliding_layers(n_layers, 3, true)?.into_iter())
            .map(|s| s && window > 0)
            .collect();
        let cfg = Self {
            vocab_size: m.vocab()?,
            hidden_size: m.usize("embedding_length")?,
            intermediate_size: m.usize("feed_forward_length")?,
            n_heads: m.heads()?,
            local,
            local_attention: window.max(2),
            rope_theta_global: m.opt_f32("rope.freq_base").unwrap_or(160_000.0),
            rope_theta_local: m.opt_f32("rope.freq_base_swa").unwrap_or(10_000.0),
            norm_eps: m.opt_f32("attention.layer_norm_epsilon").unwrap_or(1e-5),
            gelu_tanh,
            context_length: m.opt_usize("context_length").unwrap_or(8192),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// From a Hugging Face `config.json` (`model_type` `modernbert`).
    pub fn from_hf(c: &HfConfig) -> Result<Self> {
        let raw = c.raw();
        for key in ["norm_bias", "attention_bias", "mlp_bias"] {
            if raw.get(key).and_then(Value::as_bool) == Some(true) {
                return Err(EngineError::Config(format!(
                    "'{key}' is true: ModernBERT with biases is not supported"
                )));
            }
        }
        let n_layers = need(c.num_hidden_layers, "num_hidden_layers")?;
        let local = match hf_layer_flags(c, n_layers, "sliding_attention")? {
            Some(flags) => flags,
            None => {
                let every = raw
                    .get("global_attn_every_n_layers")
                    .and_then(Value::as_u64)
                    .unwrap_or(3)
                    .max(1) as usize;
                (0..n_layers).map(|i| i % every != 0).collect()
            }
        };
        let theta = |kind: &str, flat: &str, default: f64| {
            raw.get("rope_parameters")
                .and_then(|r| r.get(kind))
                .and_then(|r| r.get("rope_theta"))
                .or_else(|| raw.get(flat))
                .and_then(Value::as_f64)
                .unwrap_or(default) as f32
        };
        let gelu_tanh = gelu_is_tanh(raw.get("hidden_activation").and_then(Value::as_str))?;
        let cfg = Self {
            vocab_size: need(c.vocab_size, "vocab_size")?,
            hidden_size: need(c.hidden_size, "hidden_size")?,
            intermediate_size: need(c.intermediate_size, "intermediate_size")?,
            n_heads: hf_heads(c)?,
            local,
            local_attention: raw.get("local_attention").and_then(Value::as_u64).unwrap_or(128) as usize,
            rope_theta_global: theta("full_attention", "global_rope_theta", 160_000.0),
            rope_theta_local: theta("sliding_attention", "local_rope_theta", 10_000.0),
            norm_eps: raw.get("norm_eps").and_then(Value::as_f64).unwrap_or(1e-5) as f32,
            gelu_tanh,
            context_length: c.max_position_embeddings.unwrap_or(8192),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        check_heads(self.n_heads, self.n_heads)?;
        let hd = self.head_dim();
        if hd == 0 || hd % 2 != 0 || self.hidden_size % self.n_heads != 0 {
            return Err(EngineError::Config(
                "hidden_size must split into heads of an even width".into(),
            ));
        }
        if self.local_attention < 2 {
            return Err(EngineError::Config("local_attention must be at least 2".into()));
        }
        check_sizes(self.hidden_size, self.vocab_size, self.local.len())?;
        check_plausible(self.local.len(), self.n_heads, hd)
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.n_heads.max(1)
    }

    /// A local layer's reach in [`Attention::window`] terms: transformers masks `|q − k| ≤
    /// local_attention / 2`.
    fn window(&self) -> usize {
        self.local_attention / 2 + 1
    }

    /// The kernels: per layer the fused Wqkv, the plain output projection, the input ‖ gate
    /// projection and the plain down projection (norms, GeGLU and residual adds on the host).
    /// No LM head is loaded (an encoder), but the list names the tied one for the planner.
    pub fn kernel_specs(&self, names: &TensorNames) -> Result<KernelList> {
        use LayerTensor::*;
        names.require(Family::ModernBert, "a ModernBERT model")?;
        let (h, f) = (self.hidden_size, self.intermediate_size);
        let layers = (self.local.iter().enumerate())
            .map(|(i, &local)| {
                Ok(LayerKernels {
                    kind: if local {
                        LayerKind::SlidingAttention
                    } else {
                        LayerKind::Attention
                    },
                    kernels: vec![
                        KernelDesc::concat(KernelRole::InputProj, names, i, &[(AttnQkv, 3 * h)], h)?,
                        KernelDesc::linear(KernelRole::OutputProj, names, i, AttnOutput, h, h, false)?,
                        KernelDesc::concat(KernelRole::FfnGateUp, names, i, &[(FfnUp, 2 * f)], h)?,
                        KernelDesc::linear(KernelRole::FfnDown, names, i, FfnDown, h, f, false)?,
                    ],
                })
            })
            .collect::<Result<_>>()?;
        let mut list = KernelList {
            layers,
            lm_head: KernelDesc::lm_head(names, self.vocab_size, h)?,
        };
        list.tie_lm_head(names)?;
        Ok(list)
    }

    /// The planner's host shapes: a sandwich block with sliding-window local layers.
    pub fn plan_dims(&self) -> Result<ModelDims> {
        Ok(ModelDims {
            sliding_window: Some(SlidingWindow { window: self.window() }),
            block: BlockLayout::Sandwich,
            ..ModelDims::dense(
                self.hidden_size,
                self.intermediate_size,
                self.n_heads,
                self.n_heads,
                self.head_dim(),
                self.vocab_size,
                self.local.len(),
            )
        })
    }
}

/// Whether `hidden_activation` (`gelu` when absent) is the tanh approximation of GELU rather
/// than the exact one; anything else is refused.
fn gelu_is_tanh(name: Option<&str>) -> Result<bool> {
    match name.unwrap_or("gelu") {
        "gelu" => Ok(false),
        "gelu_new" | "gelu_pytorch_tanh" => Ok(true),
        other => Err(EngineError::Config(format!(
            "hidden_activation '{other}' is not supported for ModernBERT (gelu or gelu_pytorch_tanh)"
        ))),
    }
}

/// The registry entry: ModernBERT encoders (as embedders and classifiers' trunks; Hugging Face
/// safetensors, and llama.cpp's `modern-bert` GGUF as embedders).
pub static ARCHITECTURE: Architecture = Architecture {
    name: "modernbert",
    gguf_names: &["modern-bert"],
    hf_model_types: &["modernbert"],
    load_gguf: registry::load_gguf::<ModernBertConfig>,
    load_hf: registry::load_hf::<ModernBertConfig>,
    kernels_gguf: registry::kernels_gguf::<ModernBertConfig>,
    kernels_hf: registry::kernels_hf::<ModernBertConfig>,
};

registry::decoder_config!(ModernBertConfig, ModernBertLayers, |_| Family::ModernBert);

struct Layer {
    /// None before the first layer (transformers' `Identity`).
    attn_norm: Option<Vec<f32>>,
    mlp_norm: Vec<f32>,
    wqkv: Box<dyn Kernel>,
    wo: Box<dyn Kernel>,
    wi: Box<dyn Kernel>,
    mlp_wo: Box<dyn Kernel>,
    local: bool,
}

/// The layers of a ModernBERT encoder (the rest is the shared [`Decoder`] trunk).
pub struct ModernBertLayers {
    cfg: ModernBertConfig,
    /// The LayerNorm after the token embeddings (applied as layer 0 begins).
    embed_norm: Vec<f32>,
    /// LayerNorm's (absent) bias.
    zeros: Vec<f32>,
    layers: Vec<Layer>,
    rope_global: Rope,
    rope_local: Rope,
    attn_global: Attention,
    attn_local: Attention,
}

/// A loaded ModernBERT encoder.
pub type ModernBert = Decoder<ModernBertLayers>;

impl Decoder<ModernBertLayers> {
    /// Compile the layers; only [`Head::HiddenStates`] (an encoder has no LM head to serve).
    pub fn load_with(
        cfg: ModernBertConfig,
        store: &Arc<dyn TensorStore>,
        names: &TensorNames,
        backend: &dyn Backend,
        head: Head,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        if head == Head::Logits {
            return Err(EngineError::Config(
                "ModernBERT is an encoder (bidirectional attention), not a language model: serve it as an embedding \
                 model (its sentence-transformers directory)"
                    .into(),
            ));
        }
        let (h, hd) = (cfg.hidden_size, cfg.head_dim());
        let n_layers = cfg.local.len();
        let list = cfg.kernel_specs(names)?;
        let norm = |name: &str| norm_vector(store, name, h, 0.0);
        let mut layers = Vec::with_capacity(n_layers);
        for (i, (&local, described)) in cfg.local.iter().zip(&list.layers).enumerate() {
            use LayerTensor::*;
            let mut compiled = CompiledLayer::compile(described, backend, store, names)?;
            let attn_norm_name = names.layer(i, AttnNorm)?;
            layers.push(Layer {
                attn_norm: if i == 0 && !store.contains(&attn_norm_name) {
                    None
                } else {
                    Some(norm(&attn_norm_name)?)
                },
                mlp_norm: norm(&names.layer(i, FfnNorm)?)?,
                wqkv: compiled.take(KernelRole::InputProj)?,
                wo: compiled.take(KernelRole::OutputProj)?,
                wi: compiled.take(KernelRole::FfnGateUp)?,
                mlp_wo: compiled.take(KernelRole::FfnDown)?,
                local,
            });
            progress(i + 1, n_layers + 1);
        }
        let embed_norm = norm(&match names.layout() {
            Layout::HuggingFace(p) => format!("{p}embeddings.norm.weight"),
            Layout::Gguf => "token_embd_norm.weight".to_string(),
        })?;
        let ends = DecoderEnds::load(
            store,
            names,
            backend,
            EndsSpec {
                vocab: cfg.vocab_size,
                hidden: h,
                norm_offset: 0.0,
                norm_eps: cfg.norm_eps,
                layer_norm: true,
                embed_scale: 1.0,
                final_softcap: None,
                lm_head: None,
            },
        )?;
        progress(n_layers + 1, n_layers + 1);
        let info = ModelInfo {
            architecture: "modernbert".into(),
            vocab_size: cfg.vocab_size,
            context_length: cfg.context_length,
            n_layers,
            hidden_size: h,
        };
        let bidirectional = |window: Option<usize>| Attention {
            window,
            causal: false,
            ..Attention::causal(cfg.n_heads, cfg.n_heads, hd, AttentionPrecision::F32)
        };
        let layers = ModernBertLayers {
            embed_norm,
            zeros: vec![0.0; h],
            layers,
            rope_global: Rope::new(hd, cfg.rope_theta_global, RopePairing::Halves),
            rope_local: Rope::new(hd, cfg.rope_theta_local, RopePairing::Halves),
            attn_global: bidirectional(None),
            attn_local: bidirectional(Some(cfg.window())),
            cfg,
        };
        Ok(Decoder::new(layers, ends, info))
    }
}

/// One step's shared values: both RoPE bases' angles per lane and the scratch rows.
pub struct ModernBertStep {
    angles_global: Vec<Vec<(f32, f32)>>,
    angles_local: Vec<Vec<(f32, f32)>>,
    xn: Batch,
    qkv: Batch,
    attn: Batch,
    y: Batch,
    wi: Batch,
    act: Batch,
}

impl DecoderLayers for ModernBertLayers {
    type Step = ModernBertStep;

    fn begin(&self, lanes: &[LaneRef]) -> ModernBertStep {
        let (n, h) = (lanes.len(), self.cfg.hidden_size);
        ModernBertStep {
            angles_global: lane_angles(&self.rope_global, lanes),
            angles_local: lane_angles(&self.rope_local, lanes),
            xn: Batch::zeros(n, h),
            qkv: Batch::default(),
            attn: Batch::zeros(n, h),
            y: Batch::default(),
            wi: Batch::default(),
            act: Batch::zeros(n, self.cfg.intermediate_size),
        }
    }

    fn layer(
        &self,
        li: usize,
        step: &mut ModernBertStep,
        items: &mut [StepItem<'_>],
        lanes: &[LaneRef],
        x: &mut Batch,
        cost: &mut ForwardCost,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (h, hd, f, eps) = (cfg.hidden_size, cfg.head_dim(), cfg.intermediate_size, cfg.norm_eps);
        let n = lanes.len();
        let layer = &self.layers[li];
        let ModernBertStep {
            angles_global,
            angles_local,
            xn,
            qkv,
            attn,
            y,
            wi,
            act,
        } = step;
        if li == 0 {
            // The embeddings' LayerNorm.
            for lane in 0..n {
                let row = x.lane(lane).to_vec();
                layer_norm(&row, &self.embed_norm, &self.zeros, eps, x.lane_mut(lane));
            }
        }
        for lane in 0..n {
            match &layer.attn_norm {
                Some(w) => layer_norm(x.lane(lane), w, &self.zeros, eps, xn.lane_mut(lane)),
                None => xn.lane_mut(lane).copy_from_slice(x.lane(lane)),
            }
        }
        cost.add(layer.wqkv.run(&[&*xn], qkv)?);
        let (angles, attention, rope) = if layer.local {
            (&*angles_local, &self.attn_local, &self.rope_local)
        } else {
            (&*angles_global, &self.attn_global, &self.rope_global)
        };
        for (lane, cs) in angles.iter().enumerate() {
            for head in qkv.lane_mut(lane)[..2 * h].chunks_mut(hd) {
                rope.apply(head, cs);
            }
        }
        attention.append(items, lanes, li, qkv, h, 2 * h);
        attention.run(items, lanes, li, qkv, 0, hd, attn);
        cost.add(layer.wo.run(&[&*attn], y)?);
        add_rows(x, y);
        for lane in 0..n {
            layer_norm(x.lane(lane), &layer.mlp_norm, &self.zeros, eps, xn.lane_mut(lane));
        }
        cost.add(layer.wi.run(&[&*xn], wi)?);
        let gelu = if cfg.gelu_tanh { gelu_tanh } else { gelu_erf };
        for lane in 0..n {
            let (input, gate) = wi.lane(lane).split_at(f);
            for ((a, &i), &g) in act.lane_mut(lane).iter_mut().zip(input).zip(gate) {
                *a = gelu(i) * g;
            }
        }
        cost.add(layer.mlp_wo.run(&[&*act], y)?);
        add_rows(x, y);
        Ok(())
    }

    fn new_session(&self, ctx: usize) -> Session {
        // Bidirectional: every layer keeps every position of its input.
        Session::new(self.attn_global.cache(&vec![None; self.cfg.local.len()]), ctx)
    }

    fn bidirectional(&self) -> bool {
        true
    }
}

/// `x += y`, row by row.
fn add_rows(x: &mut Batch, y: &Batch) {
    for (a, &b) in x.as_mut_slice().iter_mut().zip(y.as_slice()) {
        *a += b;
    }
}
