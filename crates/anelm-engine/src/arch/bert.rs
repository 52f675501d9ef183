//! BERT encoder (`BertModel`, e.g. all-MiniLM-L6-v2): word + position + token-type embeddings
//! and a LayerNorm, then post-LayerNorm blocks of bidirectional attention and a GELU FFN, every
//! linear layer with a bias. Matmuls are backend kernels (the same `KernelSpec`s the decoders
//! compile; biases, GELU, LayerNorm and attention run on the CPU in f32).
//!
//! Sequences are packed, not padded: the lanes of one forward are every sequence's tokens one
//! after another, and each token attends to the tokens of its own sequence only, which is what a
//! padding mask does for a padded batch, without computing the padding.

use std::ops::Range;
use std::sync::Arc;

use anelm_ane::{KernelRole, LayerKind};
use anelm_kernels::pool;

use crate::arch::bert_attention::{AttentionShape, attend_packed};
use anelm_model::hf_config::HfConfig;
use anelm_model::tensor_store::TensorStore;

use crate::arch::bert_tensors::BertTensor;
use crate::arch::config_read::need;
use crate::arch::kernel_compile::CompiledLayer;
use crate::arch::kernel_list::{KernelDesc, KernelWeight, LayerKernels};
use crate::backend::{Backend, Kernel, KernelSpec, WeightId};
use crate::batch::Batch;
use crate::error::{EngineError, Result};
use crate::ops::{gelu_erf, gelu_tanh, layer_norm};
use crate::stored_matrix::StoredMatrix;
use crate::wide::multiversion;

/// The FFN activation of a BERT checkpoint (`hidden_act`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BertActivation {
    /// `gelu`: the exact (erf) GELU.
    GeluErf,
    /// `gelu_new` / `gelu_pytorch_tanh`: the tanh approximation.
    GeluTanh,
}

/// Hyper-parameters of a BERT encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden width.
    pub hidden_size: usize,
    /// FFN width.
    pub intermediate_size: usize,
    /// Encoder layers.
    pub n_layers: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Rows of the position table: the longest sequence the model takes.
    pub max_positions: usize,
    /// Rows of the token-type table.
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f32,
    /// FFN activation.
    pub activation: BertActivation,
}

impl BertConfig {
    /// The planner's view of this encoder (`anelm plan`, `anelm_ane::plan_encoder`).
    pub fn encoder_dims(&self) -> anelm_ane::EncoderDims {
        anelm_ane::EncoderDims {
            hidden: self.hidden_size,
            intermediate: self.intermediate_size,
            heads: self.n_heads,
            layers: self.n_layers,
            max_positions: self.max_positions,
        }
    }

    /// From a Hugging Face `config.json` with `model_type` `bert`.
    pub fn from_hf(c: &HfConfig) -> Result<Self> {
        if c.model_type != "bert" {
            return Err(EngineError::UnsupportedArchitecture {
                name: c.model_type.clone(),
                known: "bert as an encoder".into(),
            });
        }
        let raw = c.raw();
        if let Some(kind) = raw.get("position_embedding_type").and_then(|v| v.as_str())
            && kind != "absolute"
        {
            return Err(EngineError::Config(format!(
                "position_embedding_type '{kind}' is not supported: anelm runs BERT with absolute positions"
            )));
        }
        let activation = match c.hidden_act.as_deref().unwrap_or("gelu") {
            "gelu" => BertActivation::GeluErf,
            "gelu_new" | "gelu_pytorch_tanh" => BertActivation::GeluTanh,
            other => {
                return Err(EngineError::Config(format!(
                    "hidden_act '{other}' is not supported for BERT (gelu, gelu_new, gelu_pytorch_tanh)"
                )));
            }
        };
        let cfg = Self {
            vocab_size: need(c.vocab_size, "vocab_size")?,
            hidden_size: need(c.hidden_size, "hidden_size")?,
            intermediate_size: need(c.intermediate_size, "intermediate_size")?,
            n_layers: need(c.num_hidden_layers, "num_hidden_layers")?,
            n_heads: need(c.num_attention_heads, "num_attention_heads")?,
            max_positions: c.max_position_embeddings.unwrap_or(512),
            type_vocab_size: raw
                .get("type_vocab_size")
                .and_then(|v| v.as_u64())
                .map_or(2, |v| v as usize),
            layer_norm_eps: raw.get("layer_norm_eps").and_then(|v| v.as_f64()).unwrap_or(1e-12) as f32,
            activation,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(EngineError::Config(m.to_string()));
        if self.hidden_size == 0 || self.vocab_size == 0 || self.n_layers == 0 || self.max_positions == 0 {
            return bad("hidden size, vocabulary, layer count and max_position_embeddings must be positive");
        }
        if self.n_heads == 0 || self.hidden_size % self.n_heads != 0 {
            return bad("num_attention_heads must divide hidden_size");
        }
        if self.type_vocab_size == 0 {
            return bad("type_vocab_size must be positive");
        }
        if self.n_layers > 4096 || self.hidden_size > 65536 || self.max_positions > 1 << 20 {
            return bad("implausibly large layer count, width or position table: the file is corrupt");
        }
        Ok(())
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.n_heads
    }
}

impl BertConfig {
    /// The kernels each encoder layer compiles, with the tensors under `prefix` (`""` or
    /// `"bert."`): the fused q ‖ k ‖ v projection, the output projection plus residual, the FFN
    /// up projection and the down projection plus residual (biases, GELU, LayerNorm and
    /// attention run on the host). Loading compiles exactly this list and `anelm plan` plans it.
    pub fn kernel_specs(&self, prefix: &str) -> Vec<LayerKernels<BertTensor>> {
        use BertTensor::*;
        let (h, f) = (self.hidden_size, self.intermediate_size);
        let w = |t: BertTensor| WeightId::new(t.hf_name(prefix));
        let weight = |tensor: BertTensor, rows: usize, cols: usize| KernelWeight { tensor, rows, cols };
        (0..self.n_layers)
            .map(|i| LayerKernels {
                kind: LayerKind::Attention,
                kernels: vec![
                    KernelDesc {
                        role: KernelRole::InputProj,
                        spec: KernelSpec::Concat {
                            ws: vec![w(QueryWeight(i)), w(KeyWeight(i)), w(ValueWeight(i))],
                        },
                        weights: vec![
                            weight(QueryWeight(i), h, h),
                            weight(KeyWeight(i), h, h),
                            weight(ValueWeight(i), h, h),
                        ],
                        rows: 3 * h,
                        cols: h,
                    },
                    KernelDesc {
                        role: KernelRole::OutputProjResidual,
                        spec: KernelSpec::LinearResidual { w: w(AttnOutWeight(i)) },
                        weights: vec![weight(AttnOutWeight(i), h, h)],
                        rows: h,
                        cols: h,
                    },
                    KernelDesc {
                        role: KernelRole::FfnUp,
                        spec: KernelSpec::Linear { w: w(FfnUpWeight(i)) },
                        weights: vec![weight(FfnUpWeight(i), f, h)],
                        rows: f,
                        cols: h,
                    },
                    KernelDesc {
                        role: KernelRole::FfnDownResidual,
                        spec: KernelSpec::LinearResidual { w: w(FfnDownWeight(i)) },
                        weights: vec![weight(FfnDownWeight(i), h, f)],
                        rows: h,
                        cols: f,
                    },
                ],
            })
            .collect()
    }
}

/// LayerNorm weight and bias.
struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
}

struct Layer {
    /// [q; k; v] = Wqkv·x (biases added on the CPU).
    qkv: Box<dyn Kernel>,
    qkv_bias: Vec<f32>,
    /// x + Wo·attn.
    attn_out: Box<dyn Kernel>,
    attn_out_bias: Vec<f32>,
    attn_norm: Norm,
    /// Wi·x.
    ffn_up: Box<dyn Kernel>,
    ffn_up_bias: Vec<f32>,
    /// x + Wd·gelu(…).
    ffn_down: Box<dyn Kernel>,
    ffn_down_bias: Vec<f32>,
    ffn_norm: Norm,
}

/// A loaded BERT encoder.
pub struct Bert {
    cfg: BertConfig,
    word: StoredMatrix,
    positions: Vec<f32>,
    /// The token-type (segment) table, `type_vocab_size` rows: row 0 for single texts and the
    /// first text of a pair, row 1 for the second.
    token_types: Vec<f32>,
    embed_norm: Norm,
    layers: Vec<Layer>,
    max_lanes: usize,
}

impl Bert {
    /// Check every tensor's shape and compile the kernels on `backend`. `progress(done, total)`
    /// is called after each layer.
    pub fn load(
        cfg: BertConfig,
        store: &Arc<dyn TensorStore>,
        backend: &dyn Backend,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let prefix = tensor_prefix(store.as_ref());
        let name = |t: BertTensor| t.hf_name(prefix);
        let (h, ffn) = (cfg.hidden_size, cfg.intermediate_size);
        let matrix = |t: BertTensor, rows: usize, cols: usize| -> Result<StoredMatrix> {
            let m = StoredMatrix::load(store, &name(t))?;
            m.expect_shape(rows, cols)?;
            Ok(m)
        };
        let vector = |t: BertTensor, len: usize| -> Result<Vec<f32>> { matrix(t, 1, len)?.to_f32() };
        let norm = |w: BertTensor, b: BertTensor| -> Result<Norm> {
            Ok(Norm {
                w: vector(w, h)?,
                b: vector(b, h)?,
            })
        };
        let word = matrix(BertTensor::WordEmbeddings, cfg.vocab_size, h)?;
        let positions = matrix(BertTensor::PositionEmbeddings, cfg.max_positions, h)?.to_f32()?;
        let token_types = matrix(BertTensor::TokenTypeEmbeddings, cfg.type_vocab_size, h)?.to_f32()?;
        let embed_norm = norm(BertTensor::EmbeddingNormWeight, BertTensor::EmbeddingNormBias)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        let list = cfg.kernel_specs(prefix);
        let named = |t: BertTensor| -> Result<String> { Ok(name(t)) };
        for (i, described) in list.iter().enumerate() {
            use BertTensor::*;
            let mut compiled = CompiledLayer::compile_named(described, backend, store, &named)?;
            let mut qkv_bias = vector(QueryBias(i), h)?;
            qkv_bias.extend(vector(KeyBias(i), h)?);
            qkv_bias.extend(vector(ValueBias(i), h)?);
            layers.push(Layer {
                qkv: compiled.take(KernelRole::InputProj)?,
                qkv_bias,
                attn_out: compiled.take(KernelRole::OutputProjResidual)?,
                attn_out_bias: vector(AttnOutBias(i), h)?,
                attn_norm: norm(AttnNormWeight(i), AttnNormBias(i))?,
                ffn_up: compiled.take(KernelRole::FfnUp)?,
                ffn_up_bias: vector(FfnUpBias(i), ffn)?,
                ffn_down: compiled.take(KernelRole::FfnDownResidual)?,
                ffn_down_bias: vector(FfnDownBias(i), h)?,
                ffn_norm: norm(FfnNormWeight(i), FfnNormBias(i))?,
            });
            progress(i + 1, cfg.n_layers);
        }
        Ok(Self {
            word,
            positions,
            token_types,
            embed_norm,
            layers,
            max_lanes: backend.max_lanes().max(1),
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    /// Most lanes one kernel dispatch of this encoder's backend takes.
    pub fn max_lanes(&self) -> usize {
        self.max_lanes
    }

    /// Multiply-accumulates of the layers' matrices per token (the figure a throughput is set
    /// against the arithmetic unit's peak with; attention's own products are not counted).
    pub fn matmul_macs_per_token(&self) -> u64 {
        let macs = |k: &dyn Kernel| (k.shape().input * k.shape().output) as u64;
        self.layers
            .iter()
            .map(|l| {
                macs(l.qkv.as_ref()) + macs(l.attn_out.as_ref()) + macs(l.ffn_up.as_ref()) + macs(l.ffn_down.as_ref())
            })
            .sum()
    }

    /// Final hidden states of every token of `seqs`, packed: sequence `s` owns the lanes
    /// `spans(seqs)[s]`. Each sequence must be non-empty, at most `max_positions` long, with
    /// every id inside the vocabulary. Every token is of type 0 (segment A).
    pub fn encode(&self, seqs: &[&[u32]]) -> Result<Batch> {
        self.encode_typed(seqs, &[])
    }

    /// [`Bert::encode`] with each token's type (segment) id: `types[s]` has one id per token
    /// of `seqs[s]` (a text pair's second text is type 1). `types` empty: all type 0.
    pub fn encode_typed(&self, seqs: &[&[u32]], types: &[&[u32]]) -> Result<Batch> {
        let cfg = &self.cfg;
        let h = cfg.hidden_size;
        if !types.is_empty() {
            let fits = types.len() == seqs.len() && types.iter().zip(seqs).all(|(t, s)| t.len() == s.len());
            if !fits {
                return Err(EngineError::InvalidRequest(
                    "token type ids must give one type per token of every input".into(),
                ));
            }
            if let Some(&t) = types
                .iter()
                .flat_map(|t| t.iter())
                .find(|&&t| t as usize >= cfg.type_vocab_size)
            {
                return Err(EngineError::InvalidRequest(format!(
                    "token type {t} is outside the model's {} token types",
                    cfg.type_vocab_size
                )));
            }
        }
        for s in seqs {
            if s.is_empty() {
                return Err(EngineError::InvalidRequest("an input has no tokens".into()));
            }
            if s.len() > cfg.max_positions {
                return Err(EngineError::InvalidRequest(format!(
                    "an input has {} tokens, the model takes at most {}",
                    s.len(),
                    cfg.max_positions
                )));
            }
            if let Some(&t) = s.iter().find(|&&t| t as usize >= cfg.vocab_size) {
                return Err(EngineError::InvalidRequest(format!(
                    "token id {t} is outside the vocabulary (size {})",
                    cfg.vocab_size
                )));
            }
        }
        let spans = spans(seqs);
        let n = spans.last().map_or(0, |r| r.end);
        let mut x = self.embed(seqs, types, n)?;
        if n == 0 {
            return Ok(x);
        }
        let mut qkv = Batch::default();
        let mut attn = Batch::default();
        let mut y = Batch::default();
        let mut up = Batch::default();
        for layer in &self.layers {
            self.run(layer.qkv.as_ref(), &x, None, &mut qkv)?;
            bias_act(&mut qkv, &layer.qkv_bias, Act::None);
            let shape = AttentionShape {
                hidden: h,
                heads: cfg.n_heads,
            };
            attend_packed(&spans, &qkv, shape, &mut attn);
            self.run(layer.attn_out.as_ref(), &attn, Some(&x), &mut y)?;
            bias_norm(&y, &layer.attn_out_bias, &layer.attn_norm, cfg.layer_norm_eps, &mut x);
            self.run(layer.ffn_up.as_ref(), &x, None, &mut up)?;
            let act = match cfg.activation {
                BertActivation::GeluErf => Act::GeluErf,
                BertActivation::GeluTanh => Act::GeluTanh,
            };
            bias_act(&mut up, &layer.ffn_up_bias, act);
            self.run(layer.ffn_down.as_ref(), &up, Some(&x), &mut y)?;
            bias_norm(&y, &layer.ffn_down_bias, &layer.ffn_norm, cfg.layer_norm_eps, &mut x);
        }
        Ok(x)
    }

    /// LayerNorm(word + position + token type) of every token (`types` checked by the caller:
    /// empty, or one type per token).
    fn embed(&self, seqs: &[&[u32]], types: &[&[u32]], n: usize) -> Result<Batch> {
        let h = self.cfg.hidden_size;
        let mut x = Batch::zeros(n, h);
        let mut sum = vec![0f32; h];
        let mut buf = Vec::new();
        let mut lane = 0;
        for (i, s) in seqs.iter().enumerate() {
            for (pos, &tok) in s.iter().enumerate() {
                let row = self.word.read_row(tok as usize, &mut buf).unwrap_or(&[]);
                anelm_kernels::dequantize_row(self.word.format, row, &mut sum)?;
                let p = &self.positions[pos * h..(pos + 1) * h];
                let ty = types.get(i).and_then(|t| t.get(pos)).map_or(0, |&t| t as usize);
                let t = &self.token_types[ty * h..(ty + 1) * h];
                for ((v, &p), &t) in sum.iter_mut().zip(p).zip(t) {
                    *v = *v + t + p;
                }
                let norm = &self.embed_norm;
                layer_norm(&sum, &norm.w, &norm.b, self.cfg.layer_norm_eps, x.lane_mut(lane));
                lane += 1;
            }
        }
        Ok(x)
    }

    /// Run a kernel over all lanes, in pieces of at most the backend's lane count.
    fn run(&self, k: &dyn Kernel, x: &Batch, r: Option<&Batch>, out: &mut Batch) -> Result<()> {
        let lanes = x.lanes();
        if lanes <= self.max_lanes {
            return match r {
                Some(r) => k.run(&[x, r], out).map(drop),
                None => k.run(&[x], out).map(drop),
            };
        }
        let (ic, oc) = (x.channels(), k.shape().output);
        out.resize(lanes, oc);
        let mut piece_out = Batch::default();
        for start in (0..lanes).step_by(self.max_lanes) {
            let end = (start + self.max_lanes).min(lanes);
            let piece = |b: &Batch, c: usize| {
                Batch::from_vec(end - start, c, b.as_slice()[start * c..end * c].to_vec()).unwrap_or_default()
            };
            let xp = piece(x, ic);
            match r {
                Some(r) => k.run(&[&xp, &piece(r, oc)], &mut piece_out)?,
                None => k.run(&[&xp], &mut piece_out)?,
            };
            out.as_mut_slice()[start * oc..end * oc].copy_from_slice(piece_out.as_slice());
        }
        Ok(())
    }
}

/// Where the encoder's tensors are in `store`: `"bert."` for task checkpoints
/// (`BertForMaskedLM`, `BertForSequenceClassification`), `""` for a bare `BertModel`.
pub fn tensor_prefix(store: &dyn TensorStore) -> &'static str {
    if store.contains(&BertTensor::WordEmbeddings.hf_name("bert.")) {
        "bert."
    } else {
        ""
    }
}

/// The lanes each packed sequence occupies.
pub fn spans(seqs: &[&[u32]]) -> Vec<Range<usize>> {
    let mut start = 0;
    seqs.iter()
        .map(|s| {
            let r = start..start + s.len();
            start = r.end;
            r
        })
        .collect()
}

/// Lanes per parallel task of the element-wise steps (bias, GELU, LayerNorm).
const LANES_PER_TASK: usize = 16;

/// What follows a bias add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    /// Nothing (the qkv projection).
    None,
    /// Exact GELU.
    GeluErf,
    /// tanh-approximated GELU.
    GeluTanh,
}

/// x = act(x + bias), every lane, in parallel.
fn bias_act(x: &mut Batch, bias: &[f32], act: Act) {
    let c = x.channels();
    pool::global().for_each_chunk_mut(x.as_mut_slice(), c * LANES_PER_TASK, &|_, lanes| match act {
        Act::None => add_bias_rows(lanes, bias),
        Act::GeluErf => bias_gelu_erf_rows(lanes, bias),
        Act::GeluTanh => bias_gelu_tanh_rows(lanes, bias),
    });
}

multiversion! {
    /// x += bias over whole rows of `bias.len()` values.
    fn add_bias_rows(x: &mut [f32], bias: &[f32]) = add_bias_rows_body {
        for row in x.chunks_exact_mut(bias.len()) {
            for (v, b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
    }
}

multiversion! {
    /// x = gelu_erf(x + bias) over whole rows (one pass: the erf's exp is `exp_f32`, inlined
    /// and vectorised).
    fn bias_gelu_erf_rows(x: &mut [f32], bias: &[f32]) = bias_gelu_erf_rows_body {
        for row in x.chunks_exact_mut(bias.len()) {
            for (v, b) in row.iter_mut().zip(bias) {
                *v = gelu_erf(*v + b);
            }
        }
    }
}

multiversion! {
    /// x = gelu_tanh(x + bias) over whole rows.
    fn bias_gelu_tanh_rows(x: &mut [f32], bias: &[f32]) = bias_gelu_tanh_rows_body {
        for row in x.chunks_exact_mut(bias.len()) {
            for (v, b) in row.iter_mut().zip(bias) {
                *v = gelu_tanh(*v + b);
            }
        }
    }
}

/// x = LayerNorm(y + bias), every lane, in parallel.
fn bias_norm(y: &Batch, bias: &[f32], norm: &Norm, eps: f32, x: &mut Batch) {
    let h = y.channels();
    x.resize(y.lanes(), h);
    let chunk = h * LANES_PER_TASK;
    pool::global().for_each_chunk_mut(x.as_mut_slice(), chunk, &|i, xs| {
        let ys = &y.as_slice()[i * chunk..];
        let mut sum = vec![0f32; h];
        for (xr, yr) in xs.chunks_mut(h).zip(ys.chunks(h)) {
            for ((s, &v), &b) in sum.iter_mut().zip(yr).zip(bias) {
                *s = v + b;
            }
            layer_norm(&sum, &norm.w, &norm.b, eps, xr);
        }
    });
}
