//! Gemma 3 text forward: embedding scaled by √hidden, four `(1 + w)` RMSNorms per layer (input,
//! post-attention, pre-FFN, post-FFN: the attention and FFN outputs are normalised before they
//! join the residual), QK-norm, GQA attention scaled by `query_pre_attn_scalar^-½`, sliding-window (local) layers with their own RoPE base and a global layer
//! every N, GeGLU FFN with tanh-approximated GELU, tied LM head, optional final logit soft-capping.
//! `attn_logit_softcapping` is ignored, as the reference (transformers' Gemma 3 attention) and
//! llama.cpp ignore it; Gemma 3's published configs set it to null.
//!
//! Local layers keep their keys and values in ring buffers of the window's size
//! ([`crate::kv_cache::KvLayer::sliding`]), so a session's memory is bounded by the window for
//! them. GGUF files run GELU as llama.cpp's CPU path does (f16-rounded input and value); Hugging
//! Face files in f32, as transformers does.
//!
//! The residual adds happen on the CPU after the post-norms, so the output projection and the
//! FFN's down projection are plain `Linear` kernels, and the FFN's gate and up projections are one
//! fused `Concat` kernel (the GELU runs on the CPU between them).

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
use crate::arch::tensor_names::{Family, LayerTensor, TensorNames};
use crate::arch::trunk::norm_vector;
use crate::backend::{Backend, ForwardCost, Kernel};
use crate::batch::Batch;
use crate::error::{EngineError, Result};
use crate::model::{ModelInfo, StepItem};
use crate::ops::{AttentionPrecision, Rope, RopePairing, gelu_tanh, rms_norm, rms_norm_in_place};
use crate::session::Session;

/// Hyper-parameters of a Gemma 3 text model.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma3Config {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden width.
    pub hidden_size: usize,
    /// FFN width.
    pub intermediate_size: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Per layer: true for a sliding-window (local) layer, false for a global one.
    pub sliding: Vec<bool>,
    /// Window of the local layers (positions attended, the current one included).
    pub sliding_window: usize,
    /// RoPE base of the global layers.
    pub rope_theta_global: f32,
    /// RoPE base of the local layers.
    pub rope_theta_local: f32,
    /// Attention scores are multiplied by `query_pre_attn_scalar^-½`.
    pub query_pre_attn_scalar: f32,
    /// `cap · tanh(logit / cap)` on the output logits.
    pub final_softcap: Option<f32>,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Added to every stored norm weight: 1 for Hugging Face files (`(1 + w)`), 0 for GGUF
    /// (llama.cpp's converter stores `1 + w`).
    pub norm_offset: f32,
    /// Training context length.
    pub context_length: usize,
    /// How attention rounds K/V, q and probabilities.
    pub attention_precision: AttentionPrecision,
    /// GELU from f16-rounded input to an f16-rounded value, as llama.cpp's CPU path computes it
    /// (GGUF files); exact f32 GELU otherwise (transformers).
    pub gelu_f16: bool,
    /// `use_bidirectional_attention` (EmbeddingGemma): every position sees the whole input
    /// (local layers: within the window either side). An encoder: loads as an embedder only.
    pub bidirectional: bool,
}

fn positive_f32(v: Option<&Value>) -> Option<f32> {
    v.and_then(Value::as_f64).filter(|x| *x > 0.0).map(|x| x as f32)
}

impl Gemma3Config {
    /// From a Hugging Face `config.json` (`gemma3_text`, or the text part of `gemma3`).
    pub fn from_hf(c: &HfConfig) -> Result<Self> {
        let raw = c.raw();
        let hidden_size = need(c.hidden_size, "hidden_size")?;
        let n_layers = need(c.num_hidden_layers, "num_hidden_layers")?;
        let n_heads = hf_heads(c)?;
        let head_dim = c.head_dim.unwrap_or(hidden_size / n_heads);
        let sliding = match hf_layer_flags(c, n_layers, "sliding_attention")? {
            Some(flags) => flags,
            None => {
                let pattern = raw
                    .get("sliding_window_pattern")
                    .or_else(|| raw.get("_sliding_window_pattern"))
                    .and_then(Value::as_u64)
                    .unwrap_or(6)
                    .max(1) as usize;
                (0..n_layers).map(|i| (i + 1) % pattern != 0).collect()
            }
        };
        let rope = raw.get("rope_parameters");
        let local = rope
            .and_then(|p| p.get("sliding_attention"))
            .and_then(|p| p.get("rope_theta"))
            .or_else(|| raw.get("rope_local_base_freq"));
        let cfg = Self {
            vocab_size: need(c.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: need(c.intermediate_size, "intermediate_size")?,
            n_heads,
            n_kv_heads: c.num_key_value_heads.unwrap_or(n_heads),
            head_dim,
            sliding,
            sliding_window: c.sliding_window.unwrap_or(4096),
            rope_theta_global: c.rope_theta.unwrap_or(1_000_000.0) as f32,
            rope_theta_local: positive_f32(local).unwrap_or(10_000.0),
            query_pre_attn_scalar: positive_f32(raw.get("query_pre_attn_scalar")).unwrap_or(head_dim as f32),
            final_softcap: positive_f32(raw.get("final_logit_softcapping")),
            rms_eps: c.rms_norm_eps.unwrap_or(1e-6) as f32,
            norm_offset: 1.0,
            context_length: c.max_position_embeddings.unwrap_or(8192),
            attention_precision: AttentionPrecision::F32,
            gelu_f16: false,
            bidirectional: raw.get("use_bidirectional_attention").and_then(Value::as_bool) == Some(true),
        };
        // transformers halves a bidirectional model's window on load (`sliding_window // 2 + 1`,
        // exclusive bound either side): EmbeddingGemma's 512 reaches 256 positions each way.
        let cfg = if cfg.bidirectional {
            Self {
                sliding_window: cfg.sliding_window / 2 + 1,
                ..cfg
            }
        } else {
            cfg
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// From a GGUF file's `gemma3.*` (or EmbeddingGemma's `gemma-embedding.*`) metadata
    /// (llama.cpp conventions: norms stored as `1 + w`, local RoPE base 10000, a global layer
    /// every 6th unless the file says otherwise, as a period or one flag per layer).
    /// `gemma-embedding` is bidirectional, its local layers reaching `sliding_window / 2`
    /// positions either side (llama.cpp's symmetric window; transformers' halved one).
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let m = GgufMeta::new(g, "gemma3");
        let bidirectional = m.arch() == "gemma-embedding";
        let hidden_size = m.usize("embedding_length")?;
        let n_layers = m.usize("block_count")?;
        let n_heads = m.heads()?;
        let head_dim = m.head_dim(hidden_size, n_heads);
        let sliding = m.sliding_layers(n_layers, 6, false)?;
        let window = m.opt_usize("attention.sliding_window").unwrap_or(4096);
        let cfg = Self {
            vocab_size: m.vocab()?,
            hidden_size,
            intermediate_size: m.usize("feed_forward_length")?,
            n_heads,
            n_kv_heads: m.opt_usize("attention.head_count_kv").unwrap_or(n_heads),
            head_dim,
            sliding,
            sliding_window: if bidirectional { window / 2 + 1 } else { window },
            rope_theta_global: m.opt_f32("rope.freq_base").unwrap_or(1_000_000.0),
            rope_theta_local: m.opt_f32("rope.freq_base_swa").unwrap_or(10_000.0),
            query_pre_attn_scalar: head_dim as f32,
            final_softcap: m.opt_f32("final_logit_softcapping").filter(|c| *c > 0.0),
            rms_eps: m.opt_f32("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            norm_offset: 0.0,
            context_length: m.opt_usize("context_length").unwrap_or(8192),
            attention_precision: AttentionPrecision::F16,
            gelu_f16: true,
            bidirectional,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(EngineError::Config(m.to_string()));
        check_heads(self.n_heads, self.n_kv_heads)?;
        if self.head_dim == 0 || self.head_dim % 2 != 0 {
            return bad("the head width must be positive and even (RoPE rotates pairs)");
        }
        check_sizes(self.hidden_size, self.vocab_size, self.sliding.len())?;
        if self.sliding_window == 0 {
            return bad("the sliding window must be positive");
        }
        check_plausible(self.sliding.len(), self.n_heads, self.head_dim)
    }

    /// Decoder layers.
    pub fn n_layers(&self) -> usize {
        self.sliding.len()
    }
}

impl Gemma3Config {
    /// The kernels a model of this configuration compiles, with `names`' weights: per layer the
    /// fused q ‖ k ‖ v projection, the plain output projection, the fused gate ‖ up projection
    /// and the plain down projection (norms, GeGLU and residual adds run on the host); then the
    /// LM head. Loading compiles exactly this list and `anelm plan` plans it.
    pub fn kernel_specs(&self, names: &TensorNames) -> Result<KernelList> {
        use LayerTensor::*;
        names.require(Family::Gemma3, "a Gemma 3 model")?;
        let (h, f) = (self.hidden_size, self.intermediate_size);
        let q_dim = self.n_heads * self.head_dim;
        let kv_dim = self.n_kv_heads * self.head_dim;
        let layers = (self.sliding.iter().enumerate())
            .map(|(i, &sliding)| {
                Ok(LayerKernels {
                    kind: if sliding {
                        LayerKind::SlidingAttention
                    } else {
                        LayerKind::Attention
                    },
                    kernels: vec![
                        KernelDesc::qkv(names, i, q_dim, kv_dim, h)?,
                        KernelDesc::linear(KernelRole::OutputProj, names, i, AttnOutput, h, q_dim, false)?,
                        KernelDesc::concat(KernelRole::FfnGateUp, names, i, &[(FfnGate, f), (FfnUp, f)], h)?,
                        KernelDesc::linear(KernelRole::FfnDown, names, i, FfnDown, h, f, false)?,
                    ],
                })
            })
            .collect::<Result<_>>()?;
        Ok(KernelList {
            layers,
            lm_head: KernelDesc::lm_head(names, self.vocab_size, h)?,
        })
    }
}

impl Gemma3Config {
    /// The host shapes `anelm plan` models between the kernels: the sandwich block and the
    /// sliding window (which layers are local is each layer's kind in the kernel list).
    pub fn plan_dims(&self) -> Result<ModelDims> {
        Ok(ModelDims {
            sliding_window: Some(SlidingWindow {
                window: self.sliding_window,
            }),
            block: BlockLayout::Sandwich,
            ..ModelDims::dense(
                self.hidden_size,
                self.intermediate_size,
                self.n_heads,
                self.n_kv_heads,
                self.head_dim,
                self.vocab_size,
                self.n_layers(),
            )
        })
    }
}

/// The registry entry: Gemma 3 text models (and the text part of the multimodal checkpoints).
pub static ARCHITECTURE: Architecture = Architecture {
    name: "gemma3",
    gguf_names: &["gemma3", "gemma-embedding"],
    hf_model_types: &["gemma3_text", "gemma3"],
    load_gguf: registry::load_gguf::<Gemma3Config>,
    load_hf: registry::load_hf::<Gemma3Config>,
    kernels_gguf: registry::kernels_gguf::<Gemma3Config>,
    kernels_hf: registry::kernels_hf::<Gemma3Config>,
};

registry::decoder_config!(Gemma3Config, Gemma3Layers, |_| Family::Gemma3);

struct Layer {
    input_norm: Vec<f32>,
    post_attn_norm: Vec<f32>,
    pre_ffn_norm: Vec<f32>,
    post_ffn_norm: Vec<f32>,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    qkv: Box<dyn Kernel>,
    o: Box<dyn Kernel>,
    gate_up: Box<dyn Kernel>,
    down: Box<dyn Kernel>,
    sliding: bool,
}

/// The layers of a Gemma 3 text model (the rest is the shared [`Decoder`] trunk).
pub struct Gemma3Layers {
    cfg: Gemma3Config,
    layers: Vec<Layer>,
    rope_global: Rope,
    rope_local: Rope,
    attn_global: Attention,
    attn_local: Attention,
}

/// A loaded Gemma 3 text model.
pub type Gemma3 = Decoder<Gemma3Layers>;

impl Decoder<Gemma3Layers> {
    /// Compile the layers and, for [`Head::Logits`], the LM head.
    pub fn load_with(
        cfg: Gemma3Config,
        store: &Arc<dyn TensorStore>,
        names: &TensorNames,
        backend: &dyn Backend,
        head: Head,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        if cfg.bidirectional && head == Head::Logits {
            return Err(EngineError::Config(
                "use_bidirectional_attention is true: this is an encoder (EmbeddingGemma), not a language model; \
                 serve it as an embedding model (its sentence-transformers directory)"
                    .into(),
            ));
        }
        let h = cfg.hidden_size;
        let hd = cfg.head_dim;
        let n_layers = cfg.n_layers();
        let list = cfg.kernel_specs(names)?.for_store(store, names)?;
        let vector = |name: &str, len: usize| norm_vector(store, name, len, cfg.norm_offset);
        let mut layers = Vec::with_capacity(n_layers);
        for (i, (&sliding, described)) in cfg.sliding.iter().zip(&list.layers).enumerate() {
            use LayerTensor::*;
            let name = |t: LayerTensor| names.layer(i, t);
            let mut compiled = CompiledLayer::compile(described, backend, store, names)?;
            layers.push(Layer {
                input_norm: vector(&name(AttnNorm)?, h)?,
                post_attn_norm: vector(&name(PostAttnNorm)?, h)?,
                pre_ffn_norm: vector(&name(FfnNorm)?, h)?,
                post_ffn_norm: vector(&name(PostFfnNorm)?, h)?,
                q_norm: vector(&name(AttnQNorm)?, hd)?,
                k_norm: vector(&name(AttnKNorm)?, hd)?,
                qkv: compiled.take(KernelRole::InputProj)?,
                o: compiled.take(KernelRole::OutputProj)?,
                gate_up: compiled.take(KernelRole::FfnGateUp)?,
                down: compiled.take(KernelRole::FfnDown)?,
                sliding,
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
                norm_offset: cfg.norm_offset,
                norm_eps: cfg.rms_eps,
                layer_norm: false,
                embed_scale: (h as f32).sqrt(),
                final_softcap: cfg.final_softcap,
                lm_head: (head == Head::Logits).then_some(&list.lm_head),
            },
        )?;
        progress(n_layers + 1, n_layers + 1);
        let attn = |window: Option<usize>| Attention {
            scale: 1.0 / cfg.query_pre_attn_scalar.sqrt(),
            window,
            causal: !cfg.bidirectional,
            ..Attention::causal(cfg.n_heads, cfg.n_kv_heads, hd, cfg.attention_precision)
        };
        let (attn_global, attn_local) = (attn(None), attn(Some(cfg.sliding_window)));
        let info = ModelInfo {
            architecture: "gemma3".into(),
            vocab_size: cfg.vocab_size,
            context_length: cfg.context_length,
            n_layers,
            hidden_size: h,
        };
        let layers = Gemma3Layers {
            rope_global: Rope::new(hd, cfg.rope_theta_global, RopePairing::Halves),
            rope_local: Rope::new(hd, cfg.rope_theta_local, RopePairing::Halves),
            attn_global,
            attn_local,
            layers,
            cfg,
        };
        Ok(Decoder::new(layers, ends, info))
    }

    /// The configuration.
    pub fn config(&self) -> &Gemma3Config {
        &self.layers.cfg
    }
}

/// One step's shared values: both RoPE bases' angles per lane and the scratch rows.
pub struct Gemma3Step {
    angles_global: Vec<Vec<(f32, f32)>>,
    angles_local: Vec<Vec<(f32, f32)>>,
    xn: Batch,
    qkv: Batch,
    attn: Batch,
    y: Batch,
    gu: Batch,
    act: Batch,
}

impl DecoderLayers for Gemma3Layers {
    type Step = Gemma3Step;

    fn begin(&self, lanes: &[LaneRef]) -> Gemma3Step {
        let cfg = &self.cfg;
        let n = lanes.len();
        Gemma3Step {
            angles_global: lane_angles(&self.rope_global, lanes),
            angles_local: lane_angles(&self.rope_local, lanes),
            xn: Batch::zeros(n, cfg.hidden_size),
            qkv: Batch::default(),
            attn: Batch::zeros(n, cfg.n_heads * cfg.head_dim),
            y: Batch::default(),
            gu: Batch::default(),
            act: Batch::zeros(n, cfg.intermediate_size),
        }
    }

    fn layer(
        &self,
        li: usize,
        step: &mut Gemma3Step,
        items: &mut [StepItem<'_>],
        lanes: &[LaneRef],
        x: &mut Batch,
        cost: &mut ForwardCost,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (hd, ffn) = (cfg.head_dim, cfg.intermediate_size);
        let q_dim = cfg.n_heads * hd;
        let kv_dim = cfg.n_kv_heads * hd;
        let eps = cfg.rms_eps;
        let layer = &self.layers[li];
        let Gemma3Step {
            angles_global,
            angles_local,
            xn,
            qkv,
            attn,
            y,
            gu,
            act,
        } = step;
        let (angles, attention, rope) = if layer.sliding {
            (&*angles_local, &self.attn_local, &self.rope_local)
        } else {
            (&*angles_global, &self.attn_global, &self.rope_global)
        };
        let x_ref = &*x;
        xn.par_lanes_mut(&|lane, out| rms_norm(x_ref.lane(lane), &layer.input_norm, eps, 0.0, out));
        cost.add(layer.qkv.run(&[&*xn], qkv)?);
        qkv.par_lanes_mut(&|lane, row| {
            let Some(cs) = angles.get(lane) else {
                return;
            };
            let (q, kv) = row.split_at_mut(q_dim);
            for (heads, w) in [(q, &layer.q_norm), (&mut kv[..kv_dim], &layer.k_norm)] {
                for head in heads.chunks_mut(hd) {
                    rms_norm_in_place(head, w, eps, 0.0);
                    rope.apply(head, cs);
                }
            }
        });
        attention.append(items, lanes, li, qkv, q_dim, q_dim + kv_dim);
        attention.run(items, lanes, li, qkv, 0, hd, attn);
        cost.add(layer.o.run(&[&*attn], y)?);
        add_normed(x, y, &layer.post_attn_norm, eps);
        let x_ref = &*x;
        xn.par_lanes_mut(&|lane, out| rms_norm(x_ref.lane(lane), &layer.pre_ffn_norm, eps, 0.0, out));
        cost.add(layer.gate_up.run(&[&*xn], gu)?);
        // GELU(gate) · up, lanes split across the kernel pool (a prefill's 512 lanes × the
        // FFN width are millions of table lookups, gathered sixteen at a time where the CPU
        // has AVX-512).
        let gu_ref = &*gu;
        act.par_lanes_mut(&|lane, out| {
            let (g, u) = gu_ref.lane(lane).split_at(ffn);
            if cfg.gelu_f16 {
                anelm_kernels::f16_table_mul(gelu_f16_table(), GELU_F16_LO, GELU_F16_HI, g, u, out);
            } else {
                for ((a, &g), &u) in out.iter_mut().zip(g).zip(u) {
                    *a = gelu_tanh(g) * u;
                }
            }
        });
        cost.add(layer.down.run(&[&*act], y)?);
        add_normed(x, y, &layer.post_ffn_norm, eps);
        Ok(())
    }

    fn bidirectional(&self) -> bool {
        self.cfg.bidirectional
    }

    fn new_session(&self, ctx: usize) -> Session {
        // Local layers keep only their window (ring buffers); global layers every position. A
        // bidirectional local layer also looks ahead, so it keeps every position too (the window
        // is then applied by the attention's span).
        let windows: Vec<Option<usize>> = (self.cfg.sliding.iter())
            .map(|&s| (s && !self.cfg.bidirectional).then_some(self.cfg.sliding_window))
            .collect();
        // Local and global attention share heads and precision: either describes the cache.
        Session::new(self.attn_global.cache(&windows), ctx)
    }
}

/// GELU as llama.cpp's CPU path computes it: the input rounded to f16, GELU (tanh form) of that,
/// the result rounded to f16 (ggml's 65,536-entry f16 table); 0 at or below −10 and the identity at
/// or above 10.
/// The result depends only on the f16 input, so it is read from that table, built once (a
/// libm `tanh` per element was a quarter of a Gemma 3 prefill).
#[cfg(test)]
fn gelu_tanh_f16(x: f32) -> f32 {
    let mut out = [0.0];
    anelm_kernels::f16_table_mul(gelu_f16_table(), GELU_F16_LO, GELU_F16_HI, &[x], &[1.0], &mut out);
    out[0]
}

/// At or below this, ggml's GELU is 0; at or above [`GELU_F16_HI`], the identity.
const GELU_F16_LO: f32 = -10.0;
const GELU_F16_HI: f32 = 10.0;

/// `round_f16(gelu_tanh(v))` for every f16 value `v`, indexed by its bits.
fn gelu_f16_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..anelm_kernels::F16_TABLE_LEN)
            .map(|bits| anelm_kernels::round_f16(gelu_tanh(anelm_kernels::f16_to_f32(bits as u16))))
            .collect()
    })
}

/// x += rmsnorm(y) ⊙ w, lane by lane, lanes across the kernel pool.
fn add_normed(x: &mut Batch, y: &Batch, w: &[f32], eps: f32) {
    thread_local! {
        static NORMED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    x.par_lanes_mut(&|lane, xl| {
        NORMED.with(|t| {
            let mut t = t.borrow_mut();
            t.resize(xl.len(), 0.0);
            rms_norm(y.lane(lane), w, eps, 0.0, &mut t);
            for (a, &b) in xl.iter_mut().zip(t.iter()) {
                *a += b;
            }
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table gives exactly the direct computation (input rounded to f16, GELU, result
    /// rounded to f16) for every 61st f32 bit pattern and around every f16 rounding boundary.
    #[test]
    fn the_gelu_table_equals_rounding_around_the_formula_bit_for_bit() {
        let direct = |x: f32| anelm_kernels::round_f16(gelu_tanh(anelm_kernels::round_f16(x)));
        let check = |x: f32| {
            if x.is_nan() || x <= -10.0 || x >= 10.0 {
                return;
            }
            assert_eq!(gelu_tanh_f16(x).to_bits(), direct(x).to_bits(), "x = {x:e}");
        };
        for bits in (0..=u32::MAX).step_by(61) {
            check(f32::from_bits(bits));
        }
        for h in 0..=u16::MAX {
            let v = anelm_kernels::f16_to_f32(h);
            for x in [
                v,
                v.next_up(),
                v.next_down(),
                (v + anelm_kernels::f16_to_f32(h.wrapping_add(1))) / 2.0,
            ] {
                check(x);
            }
        }
    }
}
