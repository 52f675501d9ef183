//! LFM2 (Liquid AI) forward: a hybrid of gated short-convolution layers and GQA attention
//! layers, each followed by a SwiGLU FFN.
//!
//! - A conv layer: `[B | C | x] = in_proj(norm(h))`, then `y = C ⊙ conv(B ⊙ x)` where `conv` is a
//!   depthwise causal convolution over the last `conv_L_cache` positions (no bias), then
//!   `h += out_proj(y)`. Each session keeps the last `taps − 1` conv inputs per conv layer (its
//!   recurrent state, so it joins the prefix cache and session snapshots like DeltaNet's).
//! - An attention layer: per-head RMSNorm of q and k (`q_layernorm`, `k_layernorm`), rotate-half
//!   RoPE over the whole head, GQA attention, `out_proj` plus the residual.
//! - Plain RMSNorms (`w`, not `1 + w`); the final one is called `embedding_norm`; the LM head is
//!   tied to the embedding.
//! - The FFN width is `intermediate_size` adjusted as transformers does
//!   (`block_auto_adjust_ff_dim`: two thirds, times `block_ffn_dim_multiplier`, rounded up to
//!   `block_multiple_of`), and checked against the weights' shapes when they load.
//!
//! Layer kinds come from `layer_types` (`conv` / `full_attention`) or `full_attn_idxs`, or in
//! llama.cpp's `lfm2` GGUF from the per-layer KV head counts (0 marks a conv layer).

use std::sync::Arc;

use anelm_ane::{KernelRole, LayerKind, ModelDims};
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
use crate::arch::tensor_names::{Family, LayerTensor, TensorNames};
use crate::arch::trunk::{norm_vector, small_tensor};
use crate::backend::{Backend, ForwardCost, Kernel};
use crate::batch::Batch;
use crate::error::{EngineError, Result};
use crate::model::{ModelInfo, StepItem};
use crate::ops::{AttentionPrecision, Rope, RopePairing, rms_norm, rms_norm_in_place};
use crate::session::{RecurrentLayer, Session};

/// Hyper-parameters of an LFM2 model.
#[derive(Clone, Debug, PartialEq)]
pub struct Lfm2Config {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden width.
    pub hidden_size: usize,
    /// FFN width (after transformers' adjustment of `intermediate_size`).
    pub intermediate_size: usize,
    /// Per layer: true for a short-convolution layer, false for attention.
    pub conv: Vec<bool>,
    /// Attention query heads.
    pub n_heads: usize,
    /// Attention key/value heads.
    pub n_kv_heads: usize,
    /// Attention head width.
    pub head_dim: usize,
    /// RoPE base.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub norm_eps: f32,
    /// Taps of the short convolution (`conv_L_cache`).
    pub conv_taps: usize,
    /// Training context length.
    pub context_length: usize,
}

impl Lfm2Config {
    /// From a GGUF file's `lfm2.*` metadata (llama.cpp's converter): a layer is a convolution
    /// where its `attention.head_count_kv` entry is 0, the taps are `shortconv.l_cache`, the
    /// FFN width is already adjusted, the final norm is stored as `token_embd_norm`.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let m = GgufMeta::new(g, "lfm2");
        let hidden_size = m.usize("embedding_length")?;
        let n_layers = m.usize("block_count")?;
        let n_heads = m.heads()?;
        let kv = g
            .get_i32_array("lfm2.attention.head_count_kv")
            .filter(|a| a.len() == n_layers && a.iter().all(|&k| k >= 0))
            .ok_or_else(|| {
                EngineError::Config(format!(
                    "lfm2.attention.head_count_kv must list {n_layers} head counts (0 for a conv layer)"
                ))
            })?;
        let n_kv_heads = kv.iter().copied().find(|&k| k > 0).unwrap_or(n_heads as i32) as usize;
        if kv.iter().any(|&k| k > 0 && k as usize != n_kv_heads) {
            return Err(EngineError::Config(
                "LFM2 attention layers with different KV head counts are not supported".into(),
            ));
        }
        let cfg = Self {
            vocab_size: m.vocab()?,
            hidden_size,
            intermediate_size: m.usize("feed_forward_length")?,
            conv: kv.iter().map(|&k| k == 0).collect(),
            n_heads,
            n_kv_heads,
            head_dim: m.head_dim(hidden_size, n_heads),
            rope_theta: m.opt_f32("rope.freq_base").unwrap_or(1_000_000.0),
            norm_eps: m.opt_f32("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
            conv_taps: m.usize("shortconv.l_cache")?,
            context_length: m.opt_usize("context_length").unwrap_or(128_000),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// From a Hugging Face `config.json` (`model_type` `lfm2`).
    pub fn from_hf(c: &HfConfig) -> Result<Self> {
        let raw = c.raw();
        let uint = |k: &str| raw.get(k).and_then(Value::as_u64).map(|v| v as usize);
        let hidden_size = need(c.hidden_size, "hidden_size")?;
        let n_layers = need(c.num_hidden_layers, "num_hidden_layers")?;
        let n_heads = hf_heads(c)?;
        if raw.get("conv_bias").and_then(Value::as_bool) == Some(true) {
            return Err(EngineError::Config(
                "conv_bias is true: biases on LFM2's short-convolution projections are not supported".into(),
            ));
        }
        let conv = match hf_layer_flags(c, n_layers, "conv")? {
            Some(flags) => flags,
            None => {
                // transformers: every layer is attention unless `full_attn_idxs` lists some.
                match raw.get("full_attn_idxs").and_then(Value::as_array) {
                    Some(idxs) => {
                        let full: Vec<u64> = idxs.iter().filter_map(Value::as_u64).collect();
                        (0..n_layers).map(|i| !full.contains(&(i as u64))).collect()
                    }
                    None => vec![false; n_layers],
                }
            }
        };
        let cfg = Self {
            vocab_size: need(c.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: ffn_width(raw, need(c.intermediate_size, "intermediate_size")?)?,
            conv,
            n_heads,
            n_kv_heads: c.num_key_value_heads.unwrap_or(n_heads),
            head_dim: c.head_dim.unwrap_or(hidden_size / n_heads),
            rope_theta: c.rope_theta.unwrap_or(1_000_000.0) as f32,
            norm_eps: raw.get("norm_eps").and_then(Value::as_f64).unwrap_or(1e-5) as f32,
            conv_taps: uint("conv_L_cache").unwrap_or(3),
            context_length: c.max_position_embeddings.unwrap_or(128_000),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        check_heads(self.n_heads, self.n_kv_heads)?;
        if self.head_dim == 0 || self.head_dim % 2 != 0 {
            return Err(EngineError::Config(
                "the head width must be positive and even (RoPE rotates pairs)".into(),
            ));
        }
        if self.conv_taps == 0 || self.conv_taps > 64 {
            return Err(EngineError::Config(format!(
                "conv_L_cache {} is outside 1..=64",
                self.conv_taps
            )));
        }
        check_sizes(self.hidden_size, self.vocab_size, self.conv.len())?;
        check_plausible(self.conv.len(), self.n_heads, self.head_dim)
    }

    /// Decoder layers.
    pub fn n_layers(&self) -> usize {
        self.conv.len()
    }

    /// The kernels a model of this configuration compiles, with `names`' weights: per conv
    /// layer the in projection (B ‖ C ‖ x, one matrix) and the out projection plus residual, per
    /// attention layer the fused q ‖ k ‖ v projection and the output projection plus residual,
    /// each followed by the SwiGLU FFN plus residual; then the (tied) LM head.
    pub fn kernel_specs(&self, names: &TensorNames) -> Result<KernelList> {
        use LayerTensor::*;
        names.require(Family::Lfm2, "an LFM2 model")?;
        let h = self.hidden_size;
        let q_dim = self.n_heads * self.head_dim;
        let kv_dim = self.n_kv_heads * self.head_dim;
        let layers = (self.conv.iter().enumerate())
            .map(|(i, &conv)| {
                let mut kernels = if conv {
                    vec![
                        KernelDesc::concat(KernelRole::InputProj, names, i, &[(ConvInProj, 3 * h)], h)?,
                        KernelDesc::linear(KernelRole::OutputProjResidual, names, i, ConvOutProj, h, h, true)?,
                    ]
                } else {
                    vec![
                        KernelDesc::qkv(names, i, q_dim, kv_dim, h)?,
                        KernelDesc::linear(KernelRole::OutputProjResidual, names, i, AttnOutput, h, q_dim, true)?,
                    ]
                };
                kernels.push(KernelDesc::swiglu_residual(names, i, h, self.intermediate_size)?);
                Ok(LayerKernels {
                    kind: if conv {
                        LayerKind::ShortConv
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

    /// The host shapes `anelm plan` models between the kernels (which layers are convolutions
    /// is each layer's kind in the kernel list).
    pub fn plan_dims(&self) -> Result<ModelDims> {
        Ok(ModelDims::dense(
            self.hidden_size,
            self.intermediate_size,
            self.n_heads,
            self.n_kv_heads,
            self.head_dim,
            self.vocab_size,
            self.n_layers(),
        ))
    }
}

/// The FFN width transformers builds from `intermediate_size`.
fn ffn_width(raw: &Value, intermediate: usize) -> Result<usize> {
    if raw.get("block_auto_adjust_ff_dim").and_then(Value::as_bool) == Some(false) {
        return Ok(intermediate);
    }
    let mut width = 2 * intermediate / 3;
    if let Some(m) = raw.get("block_ffn_dim_multiplier").and_then(Value::as_f64) {
        let multiple = raw.get("block_multiple_of").and_then(Value::as_u64).unwrap_or(256) as usize;
        if !(m > 0.0 && m < 1e3) || multiple == 0 {
            return Err(EngineError::Config(format!(
                "block_ffn_dim_multiplier {m} / block_multiple_of {multiple} give no FFN width"
            )));
        }
        width = (m * width as f64) as usize;
        width = width.div_ceil(multiple) * multiple;
    }
    Ok(width)
}

/// The registry entry: LFM2 (Hugging Face safetensors and llama.cpp's `lfm2` GGUF).
pub static ARCHITECTURE: Architecture = Architecture {
    name: "lfm2",
    gguf_names: &["lfm2"],
    hf_model_types: &["lfm2"],
    load_gguf: registry::load_gguf::<Lfm2Config>,
    load_hf: registry::load_hf::<Lfm2Config>,
    kernels_gguf: registry::kernels_gguf::<Lfm2Config>,
    kernels_hf: registry::kernels_hf::<Lfm2Config>,
};

registry::decoder_config!(Lfm2Config, Lfm2Layers, |_| Family::Lfm2);

enum Mixer {
    /// Gated short convolution: in projection, depthwise causal conv `[hidden][taps]`, out
    /// projection plus residual.
    Conv {
        in_proj: Box<dyn Kernel>,
        weights: Vec<f32>,
        out: Box<dyn Kernel>,
    },
    /// GQA attention with per-head q/k RMSNorm.
    Attention {
        qkv: Box<dyn Kernel>,
        q_norm: Vec<f32>,
        k_norm: Vec<f32>,
        out: Box<dyn Kernel>,
    },
}

struct Layer {
    operator_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    mixer: Mixer,
    ffn_residual: Box<dyn Kernel>,
}

/// The layers of an LFM2 model (the rest is the shared [`Decoder`] trunk).
pub struct Lfm2Layers {
    cfg: Lfm2Config,
    layers: Vec<Layer>,
    rope: Rope,
    attention: Attention,
}

/// A loaded LFM2 model.
pub type Lfm2 = Decoder<Lfm2Layers>;

impl Decoder<Lfm2Layers> {
    /// Compile the layers and, for [`Head::Logits`], the LM head. `progress(done, total)` is
    /// called after each layer.
    pub fn load_with(
        cfg: Lfm2Config,
        store: &Arc<dyn TensorStore>,
        names: &TensorNames,
        backend: &dyn Backend,
        head: Head,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let n_layers = cfg.n_layers();
        let list = cfg.kernel_specs(names)?.for_store(store, names)?;
        let norm = |name: &str, len: usize| norm_vector(store, name, len, 0.0);
        let mut layers = Vec::with_capacity(n_layers);
        for (i, (&conv, described)) in cfg.conv.iter().zip(&list.layers).enumerate() {
            use LayerTensor::*;
            let name = |t: LayerTensor| names.layer(i, t);
            let mut compiled = CompiledLayer::compile(described, backend, store, names)?;
            let mixer = if conv {
                Mixer::Conv {
                    in_proj: compiled.take(KernelRole::InputProj)?,
                    weights: small_tensor(store.as_ref(), &name(ConvWeight)?, h * cfg.conv_taps)?,
                    out: compiled.take(KernelRole::OutputProjResidual)?,
                }
            } else {
                Mixer::Attention {
                    qkv: compiled.take(KernelRole::InputProj)?,
                    q_norm: norm(&name(AttnQNorm)?, hd)?,
                    k_norm: norm(&name(AttnKNorm)?, hd)?,
                    out: compiled.take(KernelRole::OutputProjResidual)?,
                }
            };
            layers.push(Layer {
                operator_norm: norm(&name(AttnNorm)?, h)?,
                ffn_norm: norm(&name(FfnNorm)?, h)?,
                mixer,
                ffn_residual: compiled.take(KernelRole::FfnResidual)?,
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
                norm_offset: 0.0,
                norm_eps: cfg.norm_eps,
                layer_norm: false,
                embed_scale: 1.0,
                final_softcap: None,
                lm_head: (head == Head::Logits).then_some(&list.lm_head),
            },
        )?;
        progress(n_layers + 1, n_layers + 1);
        let info = ModelInfo {
            architecture: "lfm2".into(),
            vocab_size: cfg.vocab_size,
            context_length: cfg.context_length,
            n_layers,
            hidden_size: h,
        };
        let layers = Lfm2Layers {
            rope: Rope::new(hd, cfg.rope_theta, RopePairing::Halves),
            attention: Attention::causal(cfg.n_heads, cfg.n_kv_heads, hd, AttentionPrecision::F32),
            layers,
            cfg,
        };
        Ok(Decoder::new(layers, ends, info))
    }
}

/// One step's shared values: RoPE angles per lane and the scratch rows.
pub struct Lfm2Step {
    angles: Vec<Vec<(f32, f32)>>,
    xn: Batch,
    proj: Batch,
    mixed: Batch,
    y: Batch,
}

impl DecoderLayers for Lfm2Layers {
    type Step = Lfm2Step;

    fn begin(&self, lanes: &[LaneRef]) -> Lfm2Step {
        let cfg = &self.cfg;
        let n = lanes.len();
        Lfm2Step {
            angles: lane_angles(&self.rope, lanes),
            xn: Batch::zeros(n, cfg.hidden_size),
            proj: Batch::default(),
            mixed: Batch::zeros(n, cfg.hidden_size.max(cfg.n_heads * cfg.head_dim)),
            y: Batch::default(),
        }
    }

    fn layer(
        &self,
        li: usize,
        step: &mut Lfm2Step,
        items: &mut [StepItem<'_>],
        lanes: &[LaneRef],
        x: &mut Batch,
        cost: &mut ForwardCost,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let q_dim = cfg.n_heads * hd;
        let kv_dim = cfg.n_kv_heads * hd;
        let eps = cfg.norm_eps;
        let n = lanes.len();
        let layer = &self.layers[li];
        let Lfm2Step {
            angles,
            xn,
            proj,
            mixed,
            y,
        } = step;
        for lane in 0..n {
            rms_norm(x.lane(lane), &layer.operator_norm, eps, 0.0, xn.lane_mut(lane));
        }
        match &layer.mixer {
            Mixer::Conv { in_proj, weights, out } => {
                cost.add(in_proj.run(&[&*xn], proj)?);
                mixed.resize(n, h);
                short_conv(items, lanes, li, proj, weights, cfg.conv_taps, h, mixed)?;
                cost.add(out.run(&[&*mixed, &*x], y)?);
            }
            Mixer::Attention {
                qkv,
                q_norm,
                k_norm,
                out,
            } => {
                cost.add(qkv.run(&[&*xn], proj)?);
                for (lane, cs) in angles.iter().enumerate() {
                    let row = proj.lane_mut(lane);
                    let (q, kv) = row.split_at_mut(q_dim);
                    for head in q.chunks_mut(hd) {
                        rms_norm_in_place(head, q_norm, eps, 0.0);
                        self.rope.apply(head, cs);
                    }
                    for head in kv[..kv_dim].chunks_mut(hd) {
                        rms_norm_in_place(head, k_norm, eps, 0.0);
                        self.rope.apply(head, cs);
                    }
                }
                self.attention.append(items, lanes, li, proj, q_dim, q_dim + kv_dim);
                mixed.resize(n, q_dim);
                self.attention.run(items, lanes, li, proj, 0, hd, mixed);
                cost.add(out.run(&[&*mixed, &*x], y)?);
            }
        }
        std::mem::swap(x, y);
        for lane in 0..n {
            rms_norm(x.lane(lane), &layer.ffn_norm, eps, 0.0, xn.lane_mut(lane));
        }
        cost.add(layer.ffn_residual.run(&[&*xn, &*x], y)?);
        std::mem::swap(x, y);
        Ok(())
    }

    fn new_session(&self, ctx: usize) -> Session {
        let history = (self.cfg.conv_taps - 1) * self.cfg.hidden_size;
        let recurrent = (self.cfg.conv.iter())
            .map(|&conv| {
                if conv {
                    RecurrentLayer::zeros(history, 0)
                } else {
                    RecurrentLayer::default()
                }
            })
            .collect();
        Session::with_recurrent(self.attention.cache(&vec![None; self.cfg.n_layers()]), recurrent, ctx)
    }
}

/// The gated short convolution of every lane: `y = C ⊙ conv(B ⊙ x)` from the in projection's
/// `[B | C | x]` rows, each session's lanes in order through its conv history (the last
/// `taps − 1` inputs, oldest first), which is left holding the newest ones.
#[allow(clippy::too_many_arguments)]
fn short_conv(
    items: &mut [StepItem<'_>],
    lanes: &[LaneRef],
    li: usize,
    proj: &Batch,
    weights: &[f32],
    taps: usize,
    h: usize,
    y: &mut Batch,
) -> Result<()> {
    let hist_len = (taps - 1) * h;
    // Inputs of the current window: the history, then this item's lanes so far.
    let mut window: Vec<f32> = Vec::new();
    let mut lane = 0;
    for it in items.iter_mut() {
        let k = it.tokens.len();
        if k == 0 {
            continue;
        }
        let state = it
            .session
            .recurrent
            .get_mut(li)
            .filter(|r| r.conv.len() == hist_len)
            .ok_or_else(|| EngineError::Config("a session of another model was passed to LFM2".into()))?;
        window.clear();
        window.extend_from_slice(&state.conv);
        for t in 0..k {
            let row = proj.lane(lane + t);
            let (b, rest) = row.split_at(h);
            let (c, xin) = rest.split_at(h);
            window.extend(b.iter().zip(&xin[..h]).map(|(b, x)| b * x));
            // Position t's inputs are window[t..t + taps] (each h wide), oldest first.
            let base = t * h;
            let out = y.lane_mut(lane + t);
            for ch in 0..h {
                let w = &weights[ch * taps..(ch + 1) * taps];
                let mut acc = 0.0f32;
                for (j, &wj) in w.iter().enumerate() {
                    acc += wj * window[base + j * h + ch];
                }
                out[ch] = c[ch] * acc;
            }
        }
        let keep = window.len() - hist_len;
        state.conv.copy_from_slice(&window[keep..]);
        lane += k;
    }
    debug_assert_eq!(lane, lanes.len());
    Ok(())
}
