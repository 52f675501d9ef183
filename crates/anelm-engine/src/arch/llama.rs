//! Llama-family forward (Llama 2/3, SmolLM2, Mistral; Qwen2/2.5, which adds biases to the q, k
//! and v projections; Qwen3, which adds per-head QK-norm; Qwen3-MoE, whose FFNs are mixtures of
//! experts; Phi-3/Phi-4-mini, whose files fuse q ‖ k ‖ v and gate ‖ up and whose RoPE is partial
//! and long-RoPE scaled): RMSNorm, RoPE, GQA attention with a KV cache (within a sliding window
//! on the layers the config marks, as Mistral and Phi-3 have them), SwiGLU FFN, tied or untied
//! LM head. Matmuls are backend kernels; the rest (the biases included) runs on the CPU in f32.

use std::sync::Arc;

use anelm_ane::{KernelRole, LayerKind, ModelDims, SlidingWindow};

use anelm_model::gguf::GgufFile;
use anelm_model::hf_config::HfConfig;
use anelm_model::tensor_store::TensorStore;

use crate::arch::attention::Attention;
use crate::arch::config_read::{GgufMeta, check_heads, check_plausible, check_sizes, hf_heads, hf_layer_flags, need};
use crate::arch::decoder::{Decoder, DecoderEnds, DecoderLayers, EndsSpec};
use crate::arch::kernel_compile::CompiledLayer;
use crate::arch::kernel_list::{KernelDesc, KernelList, LayerKernels};
use crate::arch::moe::{MoeConfig, MoeFfn};
use crate::arch::registry::{self, Architecture, Head};
use crate::arch::step::{LaneRef, lane_angles, lane_angles_by};
use crate::arch::tensor_names::{Family, LayerTensor, TensorNames};
use crate::arch::trunk::{norm_vector, small_tensor};
use crate::backend::{Backend, ForwardCost, Kernel};
use crate::batch::Batch;
use crate::error::{EngineError, Result};
use crate::expert_slices::ExpertSlices;
use crate::model::{ModelInfo, StepItem};
use crate::ops::{AttentionPrecision, Rope, RopePairing, rms_norm, rms_norm_in_place};
use crate::session::Session;

/// Hyper-parameters of a Llama-family model.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden width.
    pub hidden_size: usize,
    /// FFN width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (GQA).
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Dimensions RoPE rotates (= head_dim for Llama).
    pub rope_dims: usize,
    /// RoPE base.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Training context length.
    pub context_length: usize,
    /// How RoPE pairs elements in this file's layout.
    pub rope_pairing: RopePairing,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Biases on the q, k and v projections (Qwen2), added on the host after the fused kernel.
    pub qkv_bias: bool,
    /// How attention rounds K/V, q and probabilities.
    pub attention_precision: AttentionPrecision,
    /// Architecture name reported in [`ModelInfo`] (`llama`, `qwen3`, ...).
    pub architecture: String,
    /// The mixture-of-experts FFNs (Qwen3-MoE), where the model has them.
    pub moe: Option<MoeConfig>,
    /// Which tensor names the files use: `Llama`, or `Phi3` (fused q ‖ k ‖ v and gate ‖ up).
    pub family: Family,
    /// Long-RoPE (Phi-3): each rotated pair's frequency factors and the cos/sin scale.
    pub long_rope: Option<LongRope>,
    /// Per layer: whether it attends within [`Self::sliding_window`] only.
    pub sliding: Vec<bool>,
    /// The sliding layers' window: each position sees itself and the `window − 1` before it.
    pub sliding_window: Option<usize>,
}

/// Phi-3's long-RoPE: per rotated pair a frequency divisor for contexts up to `original` tokens
/// (`short`) and one for longer ones (`long`), and the scale of cos and sin. Which applies is the
/// session's context size, as llama.cpp decides it (`n_ctx_seq > n_ctx_orig`): a session longer
/// than the original context rotates every position with the long factors, a shorter one with
/// the short ones (transformers' choice for any sequence within the original context).
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    /// Factors for sessions up to `original` tokens.
    pub short: Vec<f32>,
    /// Factors for longer sessions.
    pub long: Vec<f32>,
    /// cos/sin scale (`attention_factor`).
    pub mscale: f32,
    /// `original_max_position_embeddings`.
    pub original: usize,
}

/// The GGUF tensors of Phi-3's long-RoPE factors (llama.cpp's `rope_factors_{short,long}`).
const GGUF_ROPE_SHORT: &str = "rope_factors_short.weight";
const GGUF_ROPE_LONG: &str = "rope_factors_long.weight";

impl LlamaConfig {
    /// From a GGUF file's `llama.*` (or `qwen3.*`) metadata.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let m = GgufMeta::new(g, "llama");
        let arch = m.arch().to_string();
        let qwen3 = matches!(arch.as_str(), "qwen3" | "qwen3moe");
        let qwen2 = arch == "qwen2";
        let phi3 = arch == "phi3";
        let n_layers = m.usize("block_count")?;
        let moe = MoeConfig::from_gguf(&m, g, n_layers)?;
        let hidden_size = m.usize("embedding_length")?;
        let n_heads = m.heads()?;
        let head_dim = m.head_dim(hidden_size, n_heads);
        let cfg = Self {
            vocab_size: m.vocab()?,
            hidden_size,
            // An all-MoE file may carry no dense FFN width.
            intermediate_size: match (m.opt_usize("feed_forward_length"), &moe) {
                (Some(f), _) => f,
                (None, Some(moe)) => moe.expert_ffn,
                (None, None) => m.usize("feed_forward_length")?,
            },
            n_layers,
            n_heads,
            n_kv_heads: m.opt_usize("attention.head_count_kv").unwrap_or(n_heads),
            head_dim,
            rope_dims: m.opt_usize("rope.dimension_count").unwrap_or(head_dim),
            rope_theta: m.opt_f32("rope.freq_base").unwrap_or(10000.0),
            rms_eps: m.opt_f32("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
            context_length: m.opt_usize("context_length").unwrap_or(4096),
            // llama.cpp's converter permutes Llama's Q/K rows for adjacent-pair RoPE; Qwen2,
            // Qwen3 and Phi-3 keep the Hugging Face order and run NeoX (rotate-half) RoPE.
            rope_pairing: if qwen3 || qwen2 || phi3 {
                RopePairing::Halves
            } else {
                RopePairing::Adjacent
            },
            qk_norm: qwen3,
            qkv_bias: qwen2,
            attention_precision: AttentionPrecision::F16,
            architecture: arch,
            moe,
            family: if phi3 { Family::Phi3 } else { Family::Llama },
            long_rope: None,
            sliding: vec![false; n_layers],
            sliding_window: None,
        };
        let cfg = if phi3 { cfg.with_gguf_phi3(g, &m)? } else { cfg };
        cfg.validate()?;
        Ok(cfg)
    }

    /// llama.cpp's `phi3` layout: `attention.sliding_window` (0: none, as Phi-4-mini writes it)
    /// over every layer, and long-RoPE as the `rope_factors_short` / `rope_factors_long` tensors
    /// with `rope.scaling.attn_factor` and `rope.scaling.original_context_length`.
    fn with_gguf_phi3(mut self, g: &GgufFile, m: &GgufMeta<'_>) -> Result<Self> {
        if let Some(w) = m.opt_usize("attention.sliding_window").filter(|&w| w > 0) {
            self.sliding = vec![true; self.n_layers];
            self.sliding_window = Some(w);
        }
        if g.contains(GGUF_ROPE_SHORT) || g.contains(GGUF_ROPE_LONG) {
            let factors = |name: &str| -> Result<Vec<f32>> {
                let f = small_tensor(g, name, self.rope_dims / 2)?;
                check_rope_factors(&f, self.rope_dims)?;
                Ok(f)
            };
            self.long_rope = Some(LongRope {
                short: factors(GGUF_ROPE_SHORT)?,
                long: factors(GGUF_ROPE_LONG)?,
                mscale: m.opt_f32("rope.scaling.attn_factor").unwrap_or(1.0),
                original: m.usize("rope.scaling.original_context_length")?.max(2),
            });
        }
        Ok(self)
    }

    /// From a Hugging Face `config.json` (`llama`, `mistral`, `qwen2`, `qwen3`).
    pub fn from_hf(c: &HfConfig) -> Result<Self> {
        let qwen2 = c.model_type == "qwen2";
        // Qwen2's q/k/v biases are part of the architecture (its config has no flag for them).
        let unsupported: &[&str] = if qwen2 {
            &["mlp_bias"]
        } else {
            &["attention_bias", "mlp_bias"]
        };
        for &key in unsupported {
            if c.raw().get(key).and_then(serde_json::Value::as_bool) == Some(true) {
                return Err(EngineError::Config(format!(
                    "'{key}' is true: linear-layer biases are not supported for this architecture"
                )));
            }
        }
        let hidden_size = need(c.hidden_size, "hidden_size")?;
        let n_heads = hf_heads(c)?;
        let head_dim = c.head_dim.unwrap_or(hidden_size / n_heads);
        let n_layers = need(c.num_hidden_layers, "num_hidden_layers")?;
        let qwen3 = matches!(c.model_type.as_str(), "qwen3" | "qwen3_moe");
        let phi3 = c.model_type == "phi3";
        let cfg = Self {
            vocab_size: need(c.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: need(c.intermediate_size, "intermediate_size")?,
            n_layers,
            n_heads,
            n_kv_heads: c.num_key_value_heads.unwrap_or(n_heads),
            head_dim,
            // Phi-4-mini rotates three quarters of each head.
            rope_dims: match c.partial_rotary_factor {
                Some(f) if f > 0.0 && f <= 1.0 => ((head_dim as f64 * f) as usize) & !1,
                _ => head_dim,
            },
            rope_theta: c.rope_theta.unwrap_or(10000.0) as f32,
            rms_eps: c.rms_norm_eps.unwrap_or(1e-6) as f32,
            context_length: c.max_position_embeddings.unwrap_or(4096),
            rope_pairing: RopePairing::Halves,
            qk_norm: qwen3,
            qkv_bias: qwen2,
            attention_precision: AttentionPrecision::F32,
            architecture: c.model_type.clone(),
            moe: MoeConfig::from_hf(c, n_layers)?,
            family: if phi3 { Family::Phi3 } else { Family::Llama },
            long_rope: None,
            sliding: vec![false; n_layers],
            sliding_window: None,
        };
        let cfg = if phi3 { cfg.with_long_rope(c)? } else { cfg };
        let cfg = cfg.with_hf_sliding_window(c)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Which layers attend within `sliding_window`, as transformers decides: its `layer_types`
    /// when the config lists them; else Qwen2/Qwen3's `use_sliding_window` from
    /// `max_window_layers` on; else (Mistral, Phi-3) every layer when `sliding_window` is set.
    fn with_hf_sliding_window(mut self, c: &HfConfig) -> Result<Self> {
        let raw = c.raw();
        let n = self.n_layers;
        if let Some(t) = c
            .layer_types
            .iter()
            .find(|t| !matches!(t.as_str(), "full_attention" | "sliding_attention"))
        {
            return Err(EngineError::Config(format!(
                "layer type '{t}' is not supported for this architecture (full_attention or sliding_attention)"
            )));
        }
        let sliding: Vec<bool> = if let Some(flags) = hf_layer_flags(c, n, "sliding_attention")? {
            flags
        } else if raw.get("use_sliding_window").is_some() {
            let on = raw.get("use_sliding_window").and_then(serde_json::Value::as_bool) == Some(true);
            let from = raw
                .get("max_window_layers")
                .and_then(serde_json::Value::as_u64)
                .map_or(0, |v| v as usize);
            (0..n).map(|i| on && c.sliding_window.is_some() && i >= from).collect()
        } else {
            vec![c.sliding_window.is_some(); n]
        };
        if sliding.iter().any(|&s| s) {
            let w = c
                .sliding_window
                .filter(|&w| w > 0)
                .ok_or_else(|| EngineError::Config("sliding-window layers need a positive sliding_window".into()))?;
            self.sliding_window = Some(w);
        }
        self.sliding = sliding;
        Ok(self)
    }

    /// Phi-3's `rope_parameters` (`longrope`: per-pair short and long frequency factors, an
    /// attention factor from the context extension; see [`LongRope`]). Any other RoPE type but
    /// `default` is refused.
    fn with_long_rope(mut self, c: &HfConfig) -> Result<Self> {
        let rope = c.raw().get("rope_parameters").or_else(|| c.raw().get("rope_scaling"));
        let kind = rope
            .and_then(|r| r.get("rope_type").or_else(|| r.get("type")))
            .and_then(serde_json::Value::as_str)
            .unwrap_or("default");
        match kind {
            "default" => return Ok(self),
            "longrope" | "su" => {}
            other => {
                return Err(EngineError::Config(format!(
                    "rope type '{other}' is not supported for Phi-3 (default or longrope)"
                )));
            }
        }
        let get = |k: &str| rope.and_then(|r| r.get(k));
        let factors = |k: &str| -> Result<Vec<f32>> {
            let f: Vec<f32> = get(k)
                .and_then(serde_json::Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(serde_json::Value::as_f64)
                        .map(|v| v as f32)
                        .collect()
                })
                .unwrap_or_default();
            check_rope_factors(&f, self.rope_dims).map_err(|e| EngineError::Config(format!("longrope {k}: {e}")))?;
            Ok(f)
        };
        let (short, long) = (factors("short_factor")?, factors("long_factor")?);
        let original = (c
            .raw()
            .get("original_max_position_embeddings")
            .or_else(|| get("original_max_position_embeddings")))
        .and_then(serde_json::Value::as_u64)
        .map(|v| v as usize)
        .filter(|&v| v > 1)
        .ok_or_else(|| EngineError::Config("longrope needs original_max_position_embeddings".into()))?;
        let factor = self.context_length as f64 / original as f64;
        let mscale = match get("attention_factor").and_then(serde_json::Value::as_f64) {
            Some(a) => a,
            None if factor <= 1.0 => 1.0,
            None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
        };
        self.long_rope = Some(LongRope {
            short,
            long,
            mscale: mscale as f32,
            original,
        });
        Ok(self)
    }

    fn validate(&self) -> Result<()> {
        check_heads(self.n_heads, self.n_kv_heads)?;
        if self.sliding.len() != self.n_layers {
            return Err(EngineError::Config("one sliding-window flag per layer".into()));
        }
        if self.head_dim == 0 || self.rope_dims > self.head_dim || self.rope_dims % 2 != 0 {
            return Err(EngineError::Config(
                "rope dimension count must be even and at most the head width".into(),
            ));
        }
        check_sizes(self.hidden_size, self.vocab_size, self.n_layers)?;
        check_plausible(self.n_layers, self.n_heads, self.head_dim)
    }
}

/// Long-RoPE factors: one positive value per rotated pair.
fn check_rope_factors(factors: &[f32], rope_dims: usize) -> Result<()> {
    if factors.len() != rope_dims / 2 || factors.iter().any(|f| f.is_nan() || *f <= 0.0) {
        return Err(EngineError::Config(format!(
            "long-RoPE factors must be {} positive values (one per rotated pair)",
            rope_dims / 2
        )));
    }
    Ok(())
}

impl LlamaConfig {
    /// The kernels a model of this configuration compiles, with `names`' weights: per layer the
    /// fused q ‖ k ‖ v projection, the output projection plus residual, and the SwiGLU FFN plus
    /// residual; then the LM head. Loading compiles exactly this list and `anelm plan` plans it.
    pub fn kernel_specs(&self, names: &TensorNames) -> Result<KernelList> {
        use LayerTensor::*;
        names.require(self.family, "a Llama-family model")?;
        let h = self.hidden_size;
        let q_dim = self.n_heads * self.head_dim;
        let kv_dim = self.n_kv_heads * self.head_dim;
        let layers = (0..self.n_layers)
            .map(|i| {
                let qkv = if self.family == Family::Phi3 {
                    KernelDesc::concat(KernelRole::InputProj, names, i, &[(AttnQkv, q_dim + 2 * kv_dim)], h)?
                } else {
                    KernelDesc::qkv(names, i, q_dim, kv_dim, h)?
                };
                let mut kernels = vec![
                    qkv,
                    KernelDesc::linear(KernelRole::OutputProjResidual, names, i, AttnOutput, h, q_dim, true)?,
                ];
                match &self.moe {
                    Some(moe) if moe.sparse[i] => {
                        for e in 0..moe.experts {
                            kernels.extend(KernelDesc::expert(names, i, e, h, moe.expert_ffn)?);
                        }
                    }
                    _ => kernels.push(KernelDesc::swiglu_residual(names, i, h, self.intermediate_size)?),
                }
                Ok(LayerKernels {
                    kind: if self.sliding[i] {
                        LayerKind::SlidingAttention
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

impl LlamaConfig {
    /// The host shapes `anelm plan` models between the kernels: every layer attention (within
    /// the sliding window on the layers marked so).
    pub fn plan_dims(&self) -> Result<ModelDims> {
        if let Some(moe) = &self.moe {
            return Err(EngineError::Config(format!(
                "the ANE planner does not take mixture-of-experts models: the router picks {} of {} expert FFNs per \
                 token at run time, so each expert would be its own program ({} per layer) dispatched on demand, \
                 which the planner's fixed per-layer kernel list does not model; run it on the CPU (--device cpu)",
                moe.top_k,
                moe.experts,
                2 * moe.experts
            )));
        }
        Ok(ModelDims {
            sliding_window: self.sliding_window.map(|window| SlidingWindow { window }),
            ..ModelDims::dense(
                self.hidden_size,
                self.intermediate_size,
                self.n_heads,
                self.n_kv_heads,
                self.head_dim,
                self.vocab_size,
                self.n_layers,
            )
        })
    }
}

/// The registry entry: Llama 2/3, SmolLM2, Mistral, Qwen2/2.5 (q/k/v biases), Qwen3 (per-head
/// QK-norm), Qwen3-MoE (Qwen3 with mixture-of-experts FFNs) and Phi-3/Phi-4-mini (fused
/// projections, partial rotary, long-RoPE).
pub static ARCHITECTURE: Architecture = Architecture {
    name: "llama",
    gguf_names: &["llama", "qwen2", "qwen3", "qwen3moe", "phi3"],
    hf_model_types: &["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "phi3"],
    load_gguf: registry::load_gguf::<LlamaConfig>,
    load_hf: registry::load_hf::<LlamaConfig>,
    kernels_gguf: registry::kernels_gguf::<LlamaConfig>,
    kernels_hf: registry::kernels_hf::<LlamaConfig>,
};

registry::decoder_config!(LlamaConfig, LlamaLayers, |c: &LlamaConfig| c.family);

struct Layer {
    attn_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    /// QK-norm weights (q, k), each `head_dim` long.
    qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// The q ‖ k ‖ v biases (Qwen2), as one row the width of the fused projection's output.
    qkv_bias: Option<Vec<f32>>,
    qkv: Box<dyn Kernel>,
    out_residual: Box<dyn Kernel>,
    ffn: Ffn,
}

/// A layer's FFN.
enum Ffn {
    /// SwiGLU plus the residual, one kernel.
    Dense(Box<dyn Kernel>),
    /// A mixture of experts (the residual added on the host).
    Moe(MoeFfn),
}

/// The layers of a Llama-family model (the rest is the shared [`Decoder`] trunk).
pub struct LlamaLayers {
    cfg: LlamaConfig,
    layers: Vec<Layer>,
    rope: Rope,
    /// Long-RoPE's rotation for sessions longer than the original context (`rope` holds the
    /// short one).
    rope_long: Option<(Rope, usize)>,
    attention: Attention,
    /// The sliding-window layers' attention (the same heads, within the window).
    attention_sliding: Attention,
}

/// A loaded Llama-family model.
pub type Llama = Decoder<LlamaLayers>;

impl Decoder<LlamaLayers> {
    /// Compile every kernel on `backend`. `progress(done, total)` is called after each layer.
    pub fn load(
        cfg: LlamaConfig,
        store: &Arc<dyn TensorStore>,
        names: &TensorNames,
        backend: &dyn Backend,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        Self::load_with(cfg, store, names, backend, Head::Logits, progress)
    }

    /// Compile the layers and, for [`Head::Logits`], the LM head.
    pub fn load_with(
        cfg: LlamaConfig,
        store: &Arc<dyn TensorStore>,
        names: &TensorNames,
        backend: &dyn Backend,
        head: Head,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let h = cfg.hidden_size;
        // Phi-3's fused gate ‖ up matrix is read as its two halves.
        let split: Arc<dyn TensorStore>;
        let store = if cfg.family == Family::Phi3 {
            let fused = (0..cfg.n_layers)
                .map(|i| Ok(names.layer(i, LayerTensor::FfnGate)?.trim_end_matches("#0").to_string()))
                .collect::<Result<Vec<_>>>()?;
            split = Arc::new(ExpertSlices::with_row_splits(store.clone(), &fused, 2));
            &split
        } else {
            store
        };
        let list = cfg.kernel_specs(names)?.for_store(store, names)?;
        let vector = |name: &str, len: usize| norm_vector(store, name, len, 0.0);
        let norm = |name: &str| vector(name, h);
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for (i, described) in list.layers.iter().enumerate() {
            use LayerTensor::*;
            let name = |t: LayerTensor| names.layer(i, t);
            let mut compiled = CompiledLayer::compile(described, backend, store, names)?;
            let qk_norm = if cfg.qk_norm {
                Some((
                    vector(&name(AttnQNorm)?, cfg.head_dim)?,
                    vector(&name(AttnKNorm)?, cfg.head_dim)?,
                ))
            } else {
                None
            };
            let qkv_bias = if cfg.qkv_bias {
                let mut b = vector(&name(AttnQBias)?, cfg.n_heads * cfg.head_dim)?;
                b.extend(vector(&name(AttnKBias)?, cfg.n_kv_heads * cfg.head_dim)?);
                b.extend(vector(&name(AttnVBias)?, cfg.n_kv_heads * cfg.head_dim)?);
                Some(b)
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: norm(&name(AttnNorm)?)?,
                ffn_norm: norm(&name(FfnNorm)?)?,
                qk_norm,
                qkv_bias,
                qkv: compiled.take(KernelRole::InputProj)?,
                out_residual: compiled.take(KernelRole::OutputProjResidual)?,
                ffn: match &cfg.moe {
                    Some(moe) if moe.sparse[i] => {
                        Ffn::Moe(MoeFfn::load(moe, h, store, &name(FfnRouter)?, &mut compiled)?)
                    }
                    _ => Ffn::Dense(compiled.take(KernelRole::FfnResidual)?),
                },
            });
            progress(i + 1, cfg.n_layers + 1);
        }
        let ends = DecoderEnds::load(
            store,
            names,
            backend,
            EndsSpec {
                vocab: cfg.vocab_size,
                hidden: h,
                norm_offset: 0.0,
                norm_eps: cfg.rms_eps,
                layer_norm: false,
                embed_scale: 1.0,
                final_softcap: None,
                lm_head: (head == Head::Logits).then_some(&list.lm_head),
            },
        )?;
        progress(cfg.n_layers + 1, cfg.n_layers + 1);
        let info = ModelInfo {
            architecture: cfg.architecture.clone(),
            vocab_size: cfg.vocab_size,
            context_length: cfg.context_length,
            n_layers: cfg.n_layers,
            hidden_size: h,
        };
        let layers = LlamaLayers {
            rope: match &cfg.long_rope {
                Some(l) => {
                    Rope::new(cfg.rope_dims, cfg.rope_theta, cfg.rope_pairing).with_scaling(l.short.clone(), l.mscale)
                }
                None => Rope::new(cfg.rope_dims, cfg.rope_theta, cfg.rope_pairing),
            },
            rope_long: cfg.long_rope.as_ref().map(|l| {
                let rope =
                    Rope::new(cfg.rope_dims, cfg.rope_theta, cfg.rope_pairing).with_scaling(l.long.clone(), l.mscale);
                (rope, l.original)
            }),
            attention: Attention::causal(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.attention_precision),
            attention_sliding: Attention {
                window: cfg.sliding_window,
                ..Attention::causal(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.attention_precision)
            },
            layers,
            cfg,
        };
        Ok(Decoder::new(layers, ends, info))
    }

    /// The configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.layers.cfg
    }
}

/// One step's shared values: RoPE angles per lane and the scratch rows.
pub struct LlamaStep {
    angles: Vec<Vec<(f32, f32)>>,
    xn: Batch,
    qkv: Batch,
    attn: Batch,
    y: Batch,
}

impl DecoderLayers for LlamaLayers {
    type Step = LlamaStep;

    fn begin(&self, lanes: &[LaneRef]) -> LlamaStep {
        let cfg = &self.cfg;
        let n = lanes.len();
        LlamaStep {
            angles: match &self.rope_long {
                // Phi-3: the long factors for a session longer than the original context.
                Some((long, original)) => lane_angles_by(lanes, |l| if l.ctx > *original { long } else { &self.rope }),
                None => lane_angles(&self.rope, lanes),
            },
            xn: Batch::zeros(n, cfg.hidden_size),
            qkv: Batch::default(),
            attn: Batch::zeros(n, cfg.n_heads * cfg.head_dim),
            y: Batch::default(),
        }
    }

    fn layer(
        &self,
        li: usize,
        step: &mut LlamaStep,
        items: &mut [StepItem<'_>],
        lanes: &[LaneRef],
        x: &mut Batch,
        cost: &mut ForwardCost,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let hd = cfg.head_dim;
        let q_dim = cfg.n_heads * hd;
        let kv_dim = cfg.n_kv_heads * hd;
        let n = lanes.len();
        let layer = &self.layers[li];
        let attention = if cfg.sliding[li] {
            &self.attention_sliding
        } else {
            &self.attention
        };
        let LlamaStep {
            angles,
            xn,
            qkv,
            attn,
            y,
        } = step;
        for lane in 0..n {
            rms_norm(x.lane(lane), &layer.attn_norm, cfg.rms_eps, 0.0, xn.lane_mut(lane));
        }
        cost.add(layer.qkv.run(&[&*xn], qkv)?);
        if let Some(bias) = &layer.qkv_bias {
            for lane in 0..n {
                for (v, b) in qkv.lane_mut(lane).iter_mut().zip(bias) {
                    *v += b;
                }
            }
        }
        // Decode steps: QK-norm, RoPE and the cache append inside the attention tasks.
        let prep = |lane: usize, head: &mut [f32], is_query: bool| {
            if let Some((wq, wk)) = &layer.qk_norm {
                rms_norm_in_place(head, if is_query { wq } else { wk }, cfg.rms_eps, 0.0);
            }
            self.rope.apply(head, &angles[lane]);
        };
        let fused = attention.run_decode_fused(items, lanes, li, qkv, q_dim, q_dim + kv_dim, &prep, attn);
        if !fused {
            // The same preparation on the caller, then the append and the attention loop.
            for lane in 0..n {
                let row = qkv.lane_mut(lane);
                for head in row[..q_dim].chunks_mut(hd) {
                    prep(lane, head, true);
                }
                for head in row[q_dim..q_dim + kv_dim].chunks_mut(hd) {
                    prep(lane, head, false);
                }
            }
            attention.append(items, lanes, li, qkv, q_dim, q_dim + kv_dim);
            attention.run(items, lanes, li, qkv, 0, hd, attn);
        }
        cost.add(layer.out_residual.run(&[&*attn, &*x], y)?);
        std::mem::swap(x, y);
        for lane in 0..n {
            rms_norm(x.lane(lane), &layer.ffn_norm, cfg.rms_eps, 0.0, xn.lane_mut(lane));
        }
        match &layer.ffn {
            Ffn::Dense(ffn_residual) => {
                cost.add(ffn_residual.run(&[&*xn, &*x], y)?);
                std::mem::swap(x, y);
            }
            Ffn::Moe(moe) => moe.forward(xn, x, cost)?,
        }
        Ok(())
    }

    fn new_session(&self, ctx: usize) -> Session {
        // Sliding-window layers keep only their window (ring buffers).
        let windows: Vec<Option<usize>> = (self.cfg.sliding.iter())
            .map(|&s| if s { self.cfg.sliding_window } else { None })
            .collect();
        Session::new(self.attention.cache(&windows), ctx)
    }
}
