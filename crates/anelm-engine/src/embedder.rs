//! `Embedder`: a sentence-transformers model directory (a BERT encoder, or a Llama-family
//! decoder such as Qwen3-Embedding; then pooling and optional normalisation), or a decoder
//! embedder's GGUF (pooling from its `<arch>.pooling_type`), loaded for embedding texts. Inputs are tokenized (after an optional instruction prefix), packed into
//! shared forwards (many inputs per forward, never one forward per input, never padded),
//! pooled and normalised as the directory's `modules.json` says.

use std::path::Path;
use std::sync::Arc;

use anelm_model::encoder_tokenizer::EncoderTokenizer;
use anelm_model::gguf::GgufFile;
use anelm_model::hf_config::HfConfig;
use anelm_model::safetensors_dir::SafetensorsDir;
use anelm_model::sentence_config::{DenseActivation, DenseLayer, SentenceConfig};
use anelm_model::tensor_store::TensorStore;
use anelm_model::tokenizer::Tokenizer;

use crate::arch::bert::{Bert, BertConfig, spans};
use crate::arch::registry;
use crate::arch::trunk::f32_matrix;
use crate::backend::Backend;
use crate::decoder_embedder::DecoderTrunk;
use crate::error::{EngineError, Result};
use crate::loader::gguf_tokenizer;
use crate::pooling::{PoolingMode, l2_normalize, pool, pooling_from_gguf};

/// Most tokens one forward packs when the backend's dispatches are shorter than an input (the
/// Neural Engine's 32 lanes): each kernel then runs the forward in dispatch-sized pieces.
pub const TOKENS_PER_FORWARD: usize = 4096;

/// What an embedding model is.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbedderInfo {
    /// Architecture (`bert`, `qwen3`, `llama`, `mistral`).
    pub architecture: String,
    /// Length of every embedding.
    pub dimensions: usize,
    /// Longest input in tokens (special tokens included); longer texts are truncated.
    pub max_tokens: usize,
    /// Vocabulary size (token inputs must be below it).
    pub vocab_size: usize,
    /// Pooling modes, in concatenation order.
    pub pooling: Vec<PoolingMode>,
    /// Whether embeddings are normalised to unit length.
    pub normalize: bool,
}

/// The network under the pooling, with its tokenizer.
enum Trunk {
    /// A BERT encoder (WordPiece tokenizer).
    Encoder {
        model: Box<Bert>,
        tokenizer: Box<EncoderTokenizer>,
        /// Most tokens per forward: the backend's dispatch size when the longest input fits
        /// one (the CPU's 512 lanes: each kernel runs the forward in one dispatch, with no
        /// copies into pieces), else [`TOKENS_PER_FORWARD`].
        forward_tokens: usize,
    },
    /// A Llama-family decoder (its own `tokenizer.json`; EOS appended when it says so).
    Decoder {
        model: Box<DecoderTrunk>,
        tokenizer: Box<Tokenizer>,
    },
}

/// A loaded embedding model.
pub struct Embedder {
    trunk: Trunk,
    info: EmbedderInfo,
    /// Named prompts of `config_sentence_transformers.json`.
    prompts: Vec<(String, String)>,
    /// Text put before every input (an instruction, e.g. Qwen3-Embedding's query prompt).
    instruction: Option<String>,
    /// Whether pooling covers the instruction's tokens (`include_prompt`).
    include_prompt: bool,
    /// Dense projections of the pooled vector, before normalising (EmbeddingGemma).
    dense: Vec<DenseLayer>,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl Embedder {
    /// Whether `path` is a sentence-transformers directory (it has a `modules.json`): the
    /// directories [`Embedder::load`] takes.
    pub fn is_embedding_dir(path: &Path) -> bool {
        path.is_dir() && path.join("modules.json").is_file()
    }

    /// Whether `path` is an embedding model [`Embedder::load`] takes: a sentence-transformers
    /// directory, or a GGUF file whose metadata names a pooling type (`<arch>.pooling_type`
    /// other than none), as llama.cpp's converter writes for embedding models.
    pub fn is_embedding_model(path: &Path) -> bool {
        if path.is_dir() {
            return Self::is_embedding_dir(path);
        }
        path.is_file() && GgufFile::open(path).is_ok_and(|g| gguf_pooling_code(&g).is_some_and(|c| c != 0))
    }

    /// Load a sentence-transformers directory or an embedding model's GGUF, compiling the
    /// model's kernels on `backend`.
    pub fn load(path: &Path, backend: &dyn Backend) -> Result<Self> {
        Self::load_with_progress(path, backend, &mut |_, _| {})
    }

    /// [`Embedder::load`], calling `progress(done, total)` after each layer.
    pub fn load_with_progress(
        path: &Path,
        backend: &dyn Backend,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        crate::loader::require_exists(path)?;
        if path.is_file() {
            return Self::load_gguf(path, backend, progress);
        }
        let dir = path;
        let st = SentenceConfig::from_dir(dir)?.ok_or_else(|| {
            EngineError::Config(format!(
                "{} has no modules.json: point at a sentence-transformers model directory (scripts/fetch-minilm.sh fetches one)",
                dir.display()
            ))
        })?;
        let hf = HfConfig::from_file(&dir.join("config.json"))?;
        let store: Arc<dyn TensorStore> = Arc::new(SafetensorsDir::open(dir)?);
        let (trunk, info) = match hf.model_type.as_str() {
            "bert" => {
                let model = Bert::load(BertConfig::from_hf(&hf)?, &store, backend, progress)?;
                let cfg = model.config();
                let max_tokens = st.max_seq_length.unwrap_or(cfg.max_positions).min(cfg.max_positions);
                let tokenizer = EncoderTokenizer::from_dir(dir, max_tokens, st.do_lower_case)?;
                check_vocab(tokenizer.vocab_size(), cfg.vocab_size)?;
                let info = EmbedderInfo {
                    architecture: "bert".into(),
                    dimensions: cfg.hidden_size * st.pooling.len(),
                    max_tokens,
                    vocab_size: cfg.vocab_size,
                    pooling: st.pooling.clone(),
                    normalize: st.normalize,
                };
                let lanes = model.max_lanes();
                let forward_tokens = if lanes >= max_tokens { lanes } else { TOKENS_PER_FORWARD };
                let trunk = Trunk::Encoder {
                    model: Box::new(model),
                    tokenizer: Box::new(tokenizer),
                    forward_tokens,
                };
                (trunk, info)
            }
            decoder if registry::is_hf_decoder(decoder) => {
                let model = DecoderTrunk::load(&hf, store, backend, progress)?;
                let tokenizer = Tokenizer::from_hf_dir(dir)?;
                check_vocab(tokenizer.vocab_size(), model.vocab_size())?;
                let ctx = model.context_length().max(2);
                let max_tokens = st
                    .max_seq_length
                    .or_else(|| tokenizer_max_length(dir))
                    .unwrap_or(ctx)
                    .min(ctx);
                let info = EmbedderInfo {
                    architecture: hf.model_type.clone(),
                    dimensions: model.hidden_size() * st.pooling.len(),
                    max_tokens,
                    vocab_size: model.vocab_size(),
                    pooling: st.pooling.clone(),
                    normalize: st.normalize,
                };
                let trunk = Trunk::Decoder {
                    model: Box::new(model),
                    tokenizer: Box::new(tokenizer),
                };
                (trunk, info)
            }
            other => {
                return Err(EngineError::Config(format!(
                    "embedding models of type '{other}' are not supported (bert, or a decoder anelm runs: {})",
                    registry::ARCHITECTURES
                        .iter()
                        .flat_map(|a| a.hf_model_types)
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        };
        let instruction = st
            .default_prompt_name
            .as_ref()
            .and_then(|name| st.prompts.iter().find(|(n, _)| n == name))
            .map(|(_, text)| text.clone());
        let mut info = info;
        // Each Dense module takes the previous width; the last one sets the embedding's.
        for (i, d) in st.dense.iter().enumerate() {
            if d.in_features != info.dimensions {
                return Err(EngineError::Config(format!(
                    "Dense module {i} takes {} values but gets {}: the model directory is inconsistent",
                    d.in_features, info.dimensions
                )));
            }
            info.dimensions = d.out_features;
        }
        let mut model = Self {
            trunk,
            info,
            prompts: st.prompts,
            instruction: None,
            include_prompt: st.include_prompt,
            dense: st.dense,
        };
        model.set_instruction(instruction)?;
        Ok(model)
    }

    /// A decoder embedder's GGUF: the Llama-family trunk (`qwen3`, `llama`), the GGUF's
    /// tokenizer, the pooling its metadata names, and L2 normalisation (GGUF does not record
    /// a Normalize module; llama.cpp's embeddings endpoint normalises by default, and so do the
    /// sentence-transformers configs of the models published as GGUF). Inputs may be as long as
    /// the training context.
    fn load_gguf(path: &Path, backend: &dyn Backend, progress: &mut dyn FnMut(usize, usize)) -> Result<Self> {
        let gguf = Arc::new(GgufFile::open(path)?);
        let arch = gguf.architecture().unwrap_or("").to_string();
        let code = gguf_pooling_code(&gguf).ok_or_else(|| {
            EngineError::Config(format!(
                "{} has no {arch}.pooling_type: it is not an embedding model's GGUF (serve it with --model as a chat model, \
                 or convert the embedding model with llama.cpp's convert_hf_to_gguf.py)",
                path.display()
            ))
        })?;
        let pooling = pooling_from_gguf(code)?;
        let tokenizer = gguf_tokenizer(&gguf)?;
        let model = DecoderTrunk::load_gguf(&gguf, backend, progress)?;
        check_vocab(tokenizer.vocab_size(), model.vocab_size())?;
        let dense = gguf_dense_layers(&gguf, model.hidden_size())?;
        let info = EmbedderInfo {
            architecture: arch,
            dimensions: dense.last().map_or(model.hidden_size(), |d| d.out_features),
            max_tokens: model.context_length().max(2),
            vocab_size: model.vocab_size(),
            pooling: vec![pooling],
            normalize: true,
        };
        Ok(Self {
            trunk: Trunk::Decoder {
                model: Box::new(model),
                tokenizer: Box::new(tokenizer),
            },
            info,
            prompts: Vec::new(),
            instruction: None,
            include_prompt: true,
            dense,
        })
    }

    /// The text of the model's prompt called `name` (`config_sentence_transformers.json`).
    pub fn prompt(&self, name: &str) -> Option<&str> {
        self.prompts.iter().find(|(n, _)| n == name).map(|(_, t)| t.as_str())
    }

    /// Names of the model's prompts.
    pub fn prompt_names(&self) -> Vec<&str> {
        self.prompts.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// Put `text` before every input from now on (`None` or empty: nothing). Loading sets the
    /// model's default prompt, if its config names one. A model whose pooling leaves the
    /// prompt's tokens out (`include_prompt: false`) with a mode other than last-token pooling
    /// is refused: anelm pools every token, so the vectors would differ from
    /// sentence-transformers'.
    pub fn set_instruction(&mut self, text: Option<String>) -> Result<()> {
        let text = text.filter(|t| !t.is_empty());
        if text.is_some() && !self.include_prompt && self.info.pooling.iter().any(|&m| m != PoolingMode::LastToken) {
            return Err(EngineError::Config(
                "this model pools without its prompt's tokens (include_prompt: false), which anelm does not support with an instruction"
                    .into(),
            ));
        }
        self.instruction = text;
        Ok(())
    }

    /// The text put before every input.
    pub fn instruction(&self) -> Option<&str> {
        self.instruction.as_deref()
    }

    /// Multiply-accumulates of an encoder's matrices per token (`None` for a decoder trunk),
    /// for setting a throughput against the arithmetic unit's peak.
    pub fn matmul_macs_per_token(&self) -> Option<u64> {
        match &self.trunk {
            Trunk::Encoder { model, .. } => Some(model.matmul_macs_per_token()),
            Trunk::Decoder { .. } => None,
        }
    }

    /// What the model is.
    pub fn info(&self) -> &EmbedderInfo {
        &self.info
    }

    /// Token ids of each text as the model sees them (instruction put before it, special
    /// tokens added, truncated to `max_tokens` keeping the special tokens, as Hugging Face
    /// tokenizers truncates).
    pub fn tokenize(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        let prefixed: Vec<String>;
        let texts: &[&str] = match &self.instruction {
            Some(p) => {
                prefixed = texts.iter().map(|t| format!("{p}{t}")).collect();
                &prefixed.iter().map(String::as_str).collect::<Vec<_>>()
            }
            None => texts,
        };
        match &self.trunk {
            Trunk::Encoder { tokenizer, .. } => Ok(tokenizer.encode_batch(texts)?),
            Trunk::Decoder { tokenizer, .. } => texts
                .iter()
                .map(|t| {
                    let mut ids = tokenizer.encode(t)?;
                    if ids.len() > self.info.max_tokens {
                        let eos = tokenizer.eos_id().filter(|_| tokenizer.adds_eos());
                        ids.truncate(self.info.max_tokens - usize::from(eos.is_some()));
                        ids.extend(eos);
                    }
                    Ok(ids)
                })
                .collect(),
        }
    }

    /// A pooled vector through the Dense modules, then normalised when the model says so.
    fn finish(&self, mut v: Vec<f32>) -> Vec<f32> {
        for d in &self.dense {
            v = d.apply(&v);
        }
        if self.info.normalize {
            l2_normalize(&mut v);
        }
        v
    }

    /// One embedding per text, in order.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let ids = self.tokenize(texts)?;
        self.embed_tokens(&ids)
    }

    /// One embedding per token sequence, in order. Each sequence is used as given (no special
    /// tokens added): non-empty, at most `max_tokens` long, ids inside the vocabulary.
    pub fn embed_tokens(&self, seqs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        for (i, s) in seqs.iter().enumerate() {
            if s.is_empty() {
                return Err(EngineError::InvalidRequest(format!("input {i} has no tokens")));
            }
            if s.len() > self.info.max_tokens {
                return Err(EngineError::InvalidRequest(format!(
                    "input {i} has {} tokens; this model takes at most {}",
                    s.len(),
                    self.info.max_tokens
                )));
            }
        }
        let (model, forward_tokens) = match &self.trunk {
            Trunk::Encoder {
                model, forward_tokens, ..
            } => (model, *forward_tokens),
            Trunk::Decoder { model, .. } => {
                let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
                let out = model.embed(&refs, &self.info.pooling)?;
                return Ok(out.into_iter().map(|v| self.finish(v)).collect());
            }
        };
        let mut out = Vec::with_capacity(seqs.len());
        let mut start = 0;
        while start < seqs.len() {
            // As many inputs as fit the forward's token budget (at least one).
            let mut end = start + 1;
            let mut tokens = seqs[start].len();
            while end < seqs.len() && tokens + seqs[end].len() <= forward_tokens {
                tokens += seqs[end].len();
                end += 1;
            }
            let group: Vec<&[u32]> = seqs[start..end].iter().map(Vec::as_slice).collect();
            let states = model.encode(&group)?;
            for span in spans(&group) {
                out.push(self.finish(pool(&self.info.pooling, &states, span)));
            }
            start = end;
        }
        Ok(out)
    }
}

/// The sentence-transformers Dense modules llama.cpp's converter keeps in an EmbeddingGemma GGUF
/// (`--sentence-transformers-dense-modules`): `dense_2.weight` (hidden → wide) then
/// `dense_3.weight` (wide → hidden), no bias, no activation. None when the file has neither.
fn gguf_dense_layers(g: &Arc<GgufFile>, hidden: usize) -> Result<Vec<DenseLayer>> {
    let store: Arc<dyn TensorStore> = g.clone();
    let mut layers: Vec<DenseLayer> = Vec::new();
    for name in ["dense_2.weight", "dense_3.weight"] {
        if !store.contains(name) {
            continue;
        }
        let in_features = layers.last().map_or(hidden, |d| d.out_features);
        let out_features = store.tensor(name)?.shape.first().copied().unwrap_or(0);
        layers.push(DenseLayer {
            weight: f32_matrix(&store, name, out_features, in_features)?,
            in_features,
            out_features,
            bias: None,
            activation: DenseActivation::Identity,
        });
    }
    if layers.last().is_some_and(|d| d.out_features != hidden) {
        return Err(EngineError::Config(format!(
            "the GGUF's Dense modules end at width {} instead of the hidden width {hidden}: dense_3.weight is missing",
            layers.last().map_or(0, |d| d.out_features)
        )));
    }
    Ok(layers)
}

/// `<arch>.pooling_type` of a GGUF, when it has one.
fn gguf_pooling_code(g: &GgufFile) -> Option<u64> {
    let arch = g.architecture()?;
    g.get_u64(&format!("{arch}.pooling_type"))
}

/// A tokenizer that knows more tokens than the model has rows is another model's.
pub(crate) fn check_vocab(tokenizer: usize, model: usize) -> Result<()> {
    if tokenizer > model {
        return Err(EngineError::Config(format!(
            "the tokenizer has {tokenizer} tokens but the model's vocabulary is {model}: the files belong to two models"
        )));
    }
    Ok(())
}

/// `model_max_length` of the directory's `tokenizer_config.json`, when it is a plausible length
/// (transformers writes a huge sentinel when there is none).
pub(crate) fn tokenizer_max_length(dir: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(dir.join("tokenizer_config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let n = v.get("model_max_length")?.as_u64()?;
    usize::try_from(n).ok().filter(|&n| (2..=1 << 24).contains(&n))
}
