//! Qwen3.5 (dense, text) forward: a hybrid of Gated DeltaNet layers ([`crate::arch::deltanet`])
//! and gated full-attention layers, each followed by a SwiGLU FFN.
//!
//! - Layer kinds from `layer_types`, else full attention at every `full_attention_interval`-th
//!   layer (default 4: three DeltaNet layers, then one attention layer).
//! - `(1 + w)` RMSNorms for input, post-attention, final, q and k norms.
//! - Gated attention: `q_proj` emits, per head, the query then an output gate; QK-norm; RoPE
//!   with rotate-half pairing on the first `partial_rotary_factor · head_dim` dimensions; the
//!   attention output is multiplied by σ(gate) before `o_proj`.
//! - Tied or untied LM head.
//!
//! Two file layouts ([`TensorNames`] of [`Family::Qwen35`]): Hugging Face safetensors, tensors under `model.` (text
//! checkpoint) or `model.language_model.` (the multimodal checkpoint; vision and `mtp.*` tensors
//! are not read), with value heads grouped by key head and `A_log`, `(1 + w)` norms stored as `w`;
//! and llama.cpp's GGUF `qwen35` (`blk.N.attn_qkv`, `ssm_*` …), with value heads tiled over the key
//! heads ([`VHeadOrder::Tiled`]), `ssm_a = −exp(A_log)` and norms stored as `1 + w`. Attention runs
//! in f32 for both layouts.

use std::sync::Arc;

use anelm_ane::{KernelRole, LayerKind, LinearAttention, ModelDims};

use anelm_model::gguf::GgufFile;
use anelm_model::hf_config::HfConfig;
use anelm_model::tensor_store::TensorStore;
use serde_json::Value;

use crate::arch::attention::Attention;
use crate::arch::config_read::{GgufMeta, check_heads, check_sizes, hf_layer_flags, need};
use crate::arch::decoder::{Decoder, DecoderEnds, DecoderLayers, EndsSpec};
use crate::arch::deltanet::{DeltaNetShape, GatedDeltaNet, VHeadOrder};
use crate::arch::kernel_compile::CompiledLayer;
use crate::arch::kernel_list::{KernelDesc, KernelList, LayerKernels};
use crate::arch::registry::{self, Architecture, Head};
use crate::arch::step::{LaneRef, lane_angles};
use crate::arch::tensor_names::{Family, LayerTensor, TensorNames};
use crate::arch::trunk::small_tensor;
use crate::backend::{Backend, ForwardCost, Kernel};
use crate::batch::Batch;
use crate::error::{EngineError, Result};
use crate::model::{ModelInfo, StepItem};
use crate::ops::{AttentionPrecision, Rope, RopePairing, rms_norm, rms_norm_in_place, sigmoid};
use crate::session::{RecurrentLayer, Session};

/// Hyper-parameters of a Qwen3.5 text model.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen35Config {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden width.
    pub hidden_size: usize,
    /// FFN width.
    pub intermediate_size: usize,
    /// Per layer: true for linear attention (Gated DeltaNet), false for full attention.
    pub linear: Vec<bool>,
    /// Attention query heads.
    pub n_heads: usize,
    /// Attention key/value heads.
    pub n_kv_heads: usize,
    /// Attention head width.
    pub head_dim: usize,
    /// Dimensions RoPE rotates (`partial_rotary_factor · head_dim`).
    pub rope_dims: usize,
    /// RoPE base.
    pub rope_theta: f32,
    /// DeltaNet dimensions.
    pub deltanet: DeltaNetShape,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Training context length.
    pub context_length: usize,
}

impl Qwen35Config {
    /// From a Hugging Face `config.json` (`qwen3_5`, whose `text_config` is used, or
    /// `qwen3_5_text`).
    pub fn from_hf(c: &HfConfig) -> Result<Self> {
        let raw = c.raw();
        let uint = |k: &str| raw.get(k).and_then(Value::as_u64).map(|v| v as usize);
        let hidden_size = need(c.hidden_size, "hidden_size")?;
        let n_layers = need(c.num_hidden_layers, "num_hidden_layers")?;
        let n_heads = need(c.num_attention_heads, "num_attention_heads")?;
        let head_dim = match c.head_dim {
            Some(d) => d,
            None => hidden_size / n_heads.max(1),
        };
        let linear = match hf_layer_flags(c, n_layers, "linear_attention")? {
            Some(flags) => flags,
            None => {
                let interval = uint("full_attention_interval").unwrap_or(4).max(1);
                (0..n_layers).map(|i| (i + 1) % interval != 0).collect()
            }
        };
        let factor = c.partial_rotary_factor.unwrap_or(0.25);
        if !(factor > 0.0 && factor <= 1.0) {
            return Err(EngineError::Config(format!(
                "partial_rotary_factor {factor} is outside (0, 1]"
            )));
        }
        let rope_dims = (head_dim as f64 * factor) as usize;
        let cfg = Self {
            vocab_size: need(c.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: need(c.intermediate_size, "intermediate_size")?,
            linear,
            n_heads,
            n_kv_heads: c.num_key_value_heads.unwrap_or(n_heads),
            head_dim,
            rope_dims,
            rope_theta: c.rope_theta.unwrap_or(10_000_000.0) as f32,
            deltanet: DeltaNetShape {
                n_k_heads: uint("linear_num_key_heads").unwrap_or(16),
                n_v_heads: uint("linear_num_value_heads").unwrap_or(32),
                k_dim: uint("linear_key_head_dim").unwrap_or(128),
                v_dim: uint("linear_value_head_dim").unwrap_or(128),
                conv_kernel: uint("linear_conv_kernel_dim").unwrap_or(4),
            },
            rms_eps: c.rms_norm_eps.unwrap_or(1e-6) as f32,
            context_length: c.max_position_embeddings.unwrap_or(32768),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// From a GGUF file's `qwen35.*` metadata (llama.cpp's converter): layer kinds from
    /// `attention.recurrent_layers` (else every `full_attention_interval`-th layer is full
    /// attention), DeltaNet sizes from `ssm.*`, rotated dimensions from `rope.dimension_count`,
    /// the vocabulary from `token_embd.weight`.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let m = GgufMeta::new(g, "qwen35");
        let hidden_size = m.usize("embedding_length")?;
        let n_layers = m.usize("block_count")?;
        let n_heads = m.usize("attention.head_count")?;
        if n_heads == 0 || n_layers > 4096 {
            return Err(EngineError::Config(format!(
                "implausible attention.head_count {n_heads} / block_count {n_layers}"
            )));
        }
        let head_dim = m.head_dim(hidden_size, n_heads);
        let linear = match m.opt_bool_array("attention.recurrent_layers") {
            Some(r) if r.len() == n_layers => r.to_vec(),
            Some(r) => {
                return Err(EngineError::Config(format!(
                    "attention.recurrent_layers lists {} layers but block_count is {n_layers}",
                    r.len()
                )));
            }
            None => {
                let interval = m.opt_usize("full_attention_interval").unwrap_or(4).max(1);
                (0..n_layers).map(|i| (i + 1) % interval != 0).collect()
            }
        };
        let n_v_heads = m.usize("ssm.time_step_rank")?;
        let inner = m.usize("ssm.inner_size")?;
        if n_v_heads == 0 || inner % n_v_heads != 0 {
            return Err(EngineError::Config(format!(
                "ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {n_v_heads}"
            )));
        }
        let embd = need(g.tensor_info("token_embd.weight"), "token_embd.weight")?;
        let vocab_size = match embd.dims.as_slice() {
            [cols, rows] if *cols as usize == hidden_size => *rows as usize,
            other => {
                return Err(EngineError::Config(format!(
                    "token_embd.weight has dims {other:?}, expected [{hidden_size}, vocab]"
                )));
            }
        };
        let cfg = Self {
            vocab_size,
            hidden_size,
            intermediate_size: m.usize("feed_forward_length")?,
            linear,
            n_heads,
            n_kv_heads: m.opt_usize("attention.head_count_kv").unwrap_or(n_heads),
            head_dim,
            rope_dims: m.opt_usize("rope.dimension_count").unwrap_or(head_dim / 4),
            rope_theta: m.opt_f32("rope.freq_base").unwrap_or(10_000_000.0),
            deltanet: DeltaNetShape {
                n_k_heads: m.usize("ssm.group_count")?,
                n_v_heads,
                k_dim: m.usize("ssm.state_size")?,
                v_dim: inner / n_v_heads,
                conv_kernel: m.usize("ssm.conv_kernel")?,
            },
            rms_eps: m.opt_f32("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            context_length: m.opt_usize("context_length").unwrap_or(32768),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(EngineError::Config(m.to_string()));
        check_heads(self.n_heads, self.n_kv_heads)?;
        if self.head_dim == 0 || self.rope_dims % 2 != 0 || self.rope_dims > self.head_dim {
            return bad("the rotated dimensions (partial_rotary_factor · head_dim) must be even and ≤ head_dim");
        }
        let d = &self.deltanet;
        if d.n_k_heads == 0 || d.n_v_heads % d.n_k_heads != 0 || d.k_dim == 0 || d.v_dim == 0 || d.conv_kernel == 0 {
            return bad("linear attention: value heads must be a positive multiple of key heads, dims positive");
        }
        check_sizes(self.hidden_size, self.vocab_size, self.linear.len())?;
        if self.linear.len() > 4096
            || self.n_heads > 4096
            || self.head_dim > 8192
            || d.n_v_heads > 4096
            || d.k_dim > 8192
            || d.v_dim > 8192
            || d.conv_kernel > 1024
            || self.hidden_size > 1 << 20
            || self.intermediate_size > 1 << 22
        {
            return bad("implausibly large layer/head counts: the file is corrupt");
        }
        Ok(())
    }

    /// Decoder layers.
    pub fn n_layers(&self) -> usize {
        self.linear.len()
    }
}

impl Qwen35Config {
    /// The kernels a model of this configuration compiles, with `names`' weights: per DeltaNet
    /// layer the fused qkv ‖ z ‖ b ‖ a projection and the output projection plus residual, per
    /// attention layer the fused (q + gate) ‖ k ‖ v projection and the output projection plus
    /// residual, each followed by the SwiGLU FFN plus residual; then the LM head. Loading
    /// compiles exactly this list and `anelm plan` plans it.
    pub fn kernel_specs(&self, names: &TensorNames) -> Result<KernelList> {
        use LayerTensor::*;
        names.require(Family::Qwen35, "a Qwen3.5 model")?;
        let h = self.hidden_size;
        let hd = self.head_dim;
        let d = self.deltanet;
        let layers = (self.linear.iter().enumerate())
            .map(|(i, &linear)| {
                let mut kernels = if linear {
                    vec![
                        KernelDesc::concat(
                            KernelRole::InputProj,
                            names,
                            i,
                            &[
                                (SsmQkv, d.conv_dim()),
                                (SsmZ, d.value_width()),
                                (SsmBeta, d.n_v_heads),
                                (SsmAlpha, d.n_v_heads),
                            ],
                            h,
                        )?,
                        KernelDesc::linear(
                            KernelRole::OutputProjResidual,
                            names,
                            i,
                            SsmOut,
                            h,
                            d.value_width(),
                            true,
                        )?,
                    ]
                } else {
                    let kv = self.n_kv_heads * hd;
                    vec![
                        // Each query head is followed by its output gate.
                        KernelDesc::qkv(names, i, 2 * self.n_heads * hd, kv, h)?,
                        KernelDesc::linear(
                            KernelRole::OutputProjResidual,
                            names,
                            i,
                            AttnOutput,
                            h,
                            self.n_heads * hd,
                            true,
                        )?,
                    ]
                };
                kernels.push(KernelDesc::swiglu_residual(names, i, h, self.intermediate_size)?);
                Ok(LayerKernels {
                    kind: if linear {
                        LayerKind::LinearAttention
                    } else {
                        LayerKind::Attention
                    },
                    kernels,
                })
            })
            .collect::<Result<_>>()?;
        Ok(KernelList {
            layers,
            lm_head: KernelDesc::lm_head(names, self.vocab_size, h)?,
        })
    }
}

impl Qwen35Config {
    /// The host shapes `anelm plan` models between the kernels: the gated attention and the
    /// DeltaNet layers' sizes (which layers are DeltaNet is each layer's kind in the kernel list,
    /// so any `layer_types` order plans).
    pub fn plan_dims(&self) -> Result<ModelDims> {
        let d = self.deltanet;
        Ok(ModelDims {
            attn_output_gate: true,
            linear_attention: Some(LinearAttention {
                key_heads: d.n_k_heads,
                value_heads: d.n_v_heads,
                key_head_dim: d.k_dim,
                value_head_dim: d.v_dim,
            }),
            ..ModelDims::dense(
                self.hidden_size,
                self.intermediate_size,
                self.n_heads,
                self.n_kv_heads,
                self.head_dim,
                self.vocab_size,
                self.linear.len(),
            )
        })
    }
}

/// The registry entry: Qwen3.5 dense text models (`qwen35` in llama.cpp's GGUF).
pub static ARCHITECTURE: Architecture = Architecture {
    name: "qwen3_5",
    gguf_names: &["qwen35"],
    hf_model_types: &["qwen3_5", "qwen3_5_text"],
    load_gguf: registry::load_gguf::<Qwen35Config>,
    load_hf: registry::load_hf::<Qwen35Config>,
    kernels_gguf: registry::kernels_gguf::<Qwen35Config>,
    kernels_hf: registry::kernels_hf::<Qwen35Config>,
};

registry::decoder_config!(Qwen35Config, Qwen35Layers, |_| Family::Qwen35);

enum Mixer {
    /// Gated DeltaNet: fused `[qkv | z | b | a]` projection, CPU recurrence, out_proj + residual.
    Linear {
        proj: Box<dyn Kernel>,
        net: GatedDeltaNet,
        out: Box<dyn Kernel>,
    },
    /// Gated attention: fused `[q+gate | k | v]` projection, QK-norm weights (1 + w), o_proj +
    /// residual.
    Attention {
        qkv: Box<dyn Kernel>,
        q_norm: Vec<f32>,
        k_norm: Vec<f32>,
        out: Box<dyn Kernel>,
    },
}

struct Layer {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    mixer: Mixer,
    ffn_residual: Box<dyn Kernel>,
}

/// The layers of a Qwen3.5 text model (the rest is the shared [`Decoder`] trunk).
pub struct Qwen35Layers {
    cfg: Qwen35Config,
    layers: Vec<Layer>,
    rope: Rope,
    attention: Attention,
}

/// A loaded Qwen3.5 text model.
pub type Qwen35 = Decoder<Qwen35Layers>;

impl Decoder<Qwen35Layers> {
    /// Compile the layers and, for [`Head::Logits`], the LM head.
    pub fn load_with(
        cfg: Qwen35Config,
        store: &Arc<dyn TensorStore>,
        names: &TensorNames,
        backend: &dyn Backend,
        head: Head,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let h = cfg.hidden_size;
        let hd = cfg.head_dim;
        let n_layers = cfg.n_layers();
        let list = cfg.kernel_specs(names)?.for_store(store, names)?;
        // GGUF stores `(1 + w)` norms as `1 + w`, Hugging Face as `w`.
        let offset = if names.is_gguf() { 0.0 } else { 1.0 };
        let vector = |name: &str, len: usize, offset: f32| -> Result<Vec<f32>> {
            let mut v = small_tensor(store.as_ref(), name, len)?;
            v.iter_mut().for_each(|w| *w += offset);
            Ok(v)
        };
        let d = cfg.deltanet;
        let mut layers = Vec::with_capacity(n_layers);
        for (i, (&linear, described)) in cfg.linear.iter().zip(&list.layers).enumerate() {
            use LayerTensor::*;
            let name = |t: LayerTensor| names.layer(i, t);
            let mut compiled = CompiledLayer::compile(described, backend, store, names)?;
            let mixer = if linear {
                let stored_a = small_tensor(store.as_ref(), &name(SsmA)?, d.n_v_heads)?;
                let (neg_a, order) = if names.is_gguf() {
                    (stored_a, VHeadOrder::Tiled)
                } else {
                    (GatedDeltaNet::neg_a_from_log(&stored_a), VHeadOrder::Grouped)
                };
                let net = GatedDeltaNet::new(
                    d,
                    small_tensor(store.as_ref(), &name(SsmConv)?, d.conv_dim() * d.conv_kernel)?,
                    neg_a,
                    small_tensor(store.as_ref(), &name(SsmDtBias)?, d.n_v_heads)?,
                    small_tensor(store.as_ref(), &name(SsmNorm)?, d.v_dim)?,
                    cfg.rms_eps,
                    order,
                )?;
                Mixer::Linear {
                    proj: compiled.take(KernelRole::InputProj)?,
                    net,
                    out: compiled.take(KernelRole::OutputProjResidual)?,
                }
            } else {
                Mixer::Attention {
                    qkv: compiled.take(KernelRole::InputProj)?,
                    q_norm: vector(&name(AttnQNorm)?, hd, offset)?,
                    k_norm: vector(&name(AttnKNorm)?, hd, offset)?,
                    out: compiled.take(KernelRole::OutputProjResidual)?,
                }
            };
            let ffn_residual = compiled.take(KernelRole::FfnResidual)?;
            layers.push(Layer {
                input_norm: vector(&name(AttnNorm)?, h, offset)?,
                post_norm: vector(&name(FfnNorm)?, h, offset)?,
                mixer,
                ffn_residual,
            });
            progress(i + 1, n_layers + 1);
        }
        let ends = DecoderEnds::load(
            store,
            names,
            backend,
            EndsSpec {
                vocab: cfg.vocab_size,
                hidden: h,
                norm_offset: offset,
                norm_eps: cfg.rms_eps,
                layer_norm: false,
                embed_scale: 1.0,
                final_softcap: None,
                lm_head: (head == Head::Logits).then_some(&list.lm_head),
            },
        )?;
        progress(n_layers + 1, n_layers + 1);
        let info = ModelInfo {
            architecture: "qwen3_5".into(),
            vocab_size: cfg.vocab_size,
            context_length: cfg.context_length,
            n_layers,
            hidden_size: h,
        };
        let layers = Qwen35Layers {
            rope: Rope::new(cfg.rope_dims, cfg.rope_theta, RopePairing::Halves),
            attention: Attention::causal(cfg.n_heads, cfg.n_kv_heads, hd, AttentionPrecision::F32),
            layers,
            cfg,
        };
        Ok(Decoder::new(layers, ends, info))
    }

    /// The configuration.
    pub fn config(&self) -> &Qwen35Config {
        &self.layers.cfg
    }
}

/// One step's shared values: RoPE angles per lane, each lane's session, and the scratch rows.
pub struct Qwen35Step {
    angles: Vec<Vec<(f32, f32)>>,
    lane_items: Vec<usize>,
    xn: Batch,
    proj: Batch,
    attn: Batch,
    mixed: Batch,
    y: Batch,
    conv: Batch,
}

impl DecoderLayers for Qwen35Layers {
    type Step = Qwen35Step;

    fn begin(&self, lanes: &[LaneRef]) -> Qwen35Step {
        let cfg = &self.cfg;
        let n = lanes.len();
        Qwen35Step {
            angles: lane_angles(&self.rope, lanes),
            lane_items: lanes.iter().map(|l| l.item).collect(),
            xn: Batch::zeros(n, cfg.hidden_size),
            proj: Batch::default(),
            attn: Batch::zeros(n, cfg.n_heads * cfg.head_dim),
            mixed: Batch::zeros(n, cfg.deltanet.value_width()),
            y: Batch::default(),
            conv: Batch::default(),
        }
    }

    fn layer(
        &self,
        li: usize,
        step: &mut Qwen35Step,
        items: &mut [StepItem<'_>],
        lanes: &[LaneRef],
        x: &mut Batch,
        cost: &mut ForwardCost,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let hd = cfg.head_dim;
        let q_dim = cfg.n_heads * hd;
        let kv_dim = cfg.n_kv_heads * hd;
        let eps = cfg.rms_eps;
        let n = lanes.len();
        let layer = &self.layers[li];
        let Qwen35Step {
            angles,
            lane_items,
            xn,
            proj,
            attn,
            mixed,
            y,
            conv,
        } = step;
        for lane in 0..n {
            rms_norm(x.lane(lane), &layer.input_norm, eps, 0.0, xn.lane_mut(lane));
        }
        match &layer.mixer {
            Mixer::Linear { proj: p, net, out } => {
                cost.add(p.run(&[&*xn], proj)?);
                let mut states = items
                    .iter_mut()
                    .map(|it| it.session.recurrent.get_mut(li))
                    .collect::<Option<Vec<&mut RecurrentLayer>>>()
                    .ok_or_else(|| EngineError::Config("a session of another model was passed to Qwen3.5".into()))?;
                net.forward(&mut states, lane_items, proj, conv, mixed)?;
                cost.add(out.run(&[&*mixed, &*x], y)?);
            }
            Mixer::Attention {
                qkv,
                q_norm,
                k_norm,
                out,
            } => {
                cost.add(qkv.run(&[&*xn], proj)?);
                // Per head: [query | gate] (2·hd) for q heads, then k, then v.
                for (lane, cs) in angles.iter().enumerate() {
                    let row = proj.lane_mut(lane);
                    let (qg, kv) = row.split_at_mut(2 * q_dim);
                    for head in qg.chunks_mut(2 * hd) {
                        let q = &mut head[..hd];
                        rms_norm_in_place(q, q_norm, eps, 0.0);
                        self.rope.apply(q, cs);
                    }
                    for k in kv[..kv_dim].chunks_mut(hd) {
                        rms_norm_in_place(k, k_norm, eps, 0.0);
                        self.rope.apply(k, cs);
                    }
                }
                self.attention
                    .append(items, lanes, li, proj, 2 * q_dim, 2 * q_dim + kv_dim);
                self.attention.run(items, lanes, li, proj, 0, 2 * hd, attn);
                // Output gate: o ⊙ σ(gate).
                for lane in 0..n {
                    let gates = &proj.lane(lane)[..2 * q_dim];
                    for (o, g) in attn.lane_mut(lane).chunks_mut(hd).zip(gates.chunks(2 * hd)) {
                        for (ov, &gv) in o.iter_mut().zip(&g[hd..]) {
                            *ov *= sigmoid(gv);
                        }
                    }
                }
                cost.add(out.run(&[&*attn, &*x], y)?);
            }
        }
        std::mem::swap(x, y);
        for lane in 0..n {
            rms_norm(x.lane(lane), &layer.post_norm, eps, 0.0, xn.lane_mut(lane));
        }
        cost.add(layer.ffn_residual.run(&[&*xn, &*x], y)?);
        std::mem::swap(x, y);
        Ok(())
    }

    fn new_session(&self, ctx: usize) -> Session {
        let recurrent = self
            .cfg
            .linear
            .iter()
            .map(|&l| {
                if l {
                    self.cfg.deltanet.new_state()
                } else {
                    RecurrentLayer::default()
                }
            })
            .collect();
        Session::with_recurrent(self.attention.cache(&vec![None; self.cfg.n_layers()]), recurrent, ctx)
    }
}
