//! `Embedder`: a sentence-transformers model directory (BERT encoder + pooling + optional
//! normalisation) loaded for embedding texts. Inputs are tokenized, packed into forwards of up to
//! `TOKENS_PER_FORWARD` tokens (many inputs per forward, never one forward per input), pooled
//! and normalised as the directory's `modules.json` says.

use std::path::Path;
use std::sync::Arc;

use anelm_model::encoder_tokenizer::EncoderTokenizer;
use anelm_model::hf_config::HfConfig;
use anelm_model::safetensors_dir::SafetensorsDir;
use anelm_model::sentence_config::SentenceConfig;
use anelm_model::tensor_store::TensorStore;

use crate::arch::bert::{Bert, BertConfig, spans};
use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::pooling::{PoolingMode, l2_normalize, pool};

/// Most tokens one forward packs when the backend's dispatches are shorter than an input (the
/// Neural Engine's 32 lanes): each kernel then runs the forward in dispatch-sized pieces.
pub const TOKENS_PER_FORWARD: usize = 4096;

/// What an embedding model is.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbedderInfo {
    /// Architecture (`bert`).
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

/// A loaded embedding model.
pub struct Embedder {
    encoder: Bert,
    tokenizer: EncoderTokenizer,
    info: EmbedderInfo,
    /// Most tokens per forward: the backend's dispatch size when the longest input fits one
    /// (the CPU's 512 lanes: each kernel runs the forward in one dispatch, with no copies into
    /// pieces), else [`TOKENS_PER_FORWARD`].
    forward_tokens: usize,
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

    /// Load a sentence-transformers directory, compiling the encoder's kernels on `backend`.
    pub fn load(dir: &Path, backend: &dyn Backend) -> Result<Self> {
        Self::load_with_progress(dir, backend, &mut |_, _| {})
    }

    /// [`Embedder::load`], calling `progress(done, total)` after each layer.
    pub fn load_with_progress(
        dir: &Path,
        backend: &dyn Backend,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let st = SentenceConfig::from_dir(dir)?.ok_or_else(|| {
            EngineError::Config(format!(
                "{} has no modules.json: point at a sentence-transformers model directory (scripts/fetch-minilm.sh fetches one)",
                dir.display()
            ))
        })?;
        let hf = HfConfig::from_file(&dir.join("config.json"))?;
        let cfg = BertConfig::from_hf(&hf)?;
        let store: Arc<dyn TensorStore> = Arc::new(SafetensorsDir::open(dir)?);
        let encoder = Bert::load(cfg, &store, backend, progress)?;
        let cfg = encoder.config();
        let max_tokens = st.max_seq_length.unwrap_or(cfg.max_positions).min(cfg.max_positions);
        let tokenizer = EncoderTokenizer::from_dir(dir, max_tokens, st.do_lower_case)?;
        if tokenizer.vocab_size() > cfg.vocab_size {
            return Err(EngineError::Config(format!(
                "tokenizer.json has {} tokens but the model's vocabulary is {}: the directory mixes two models",
                tokenizer.vocab_size(),
                cfg.vocab_size
            )));
        }
        let info = EmbedderInfo {
            architecture: "bert".into(),
            dimensions: cfg.hidden_size * st.pooling.len(),
            max_tokens,
            vocab_size: cfg.vocab_size,
            pooling: st.pooling,
            normalize: st.normalize,
        };
        let lanes = encoder.max_lanes();
        let forward_tokens = if lanes >= max_tokens { lanes } else { TOKENS_PER_FORWARD };
        Ok(Self {
            encoder,
            tokenizer,
            info,
            forward_tokens,
        })
    }

    /// What the model is.
    pub fn info(&self) -> &EmbedderInfo {
        &self.info
    }

    /// Token ids of each text as the model sees them (special tokens added, truncated to
    /// `max_tokens`).
    pub fn tokenize(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        Ok(self.tokenizer.encode_batch(texts)?)
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
        let mut out = Vec::with_capacity(seqs.len());
        let mut start = 0;
        while start < seqs.len() {
            // As many inputs as fit the forward's token budget (at least one).
            let mut end = start + 1;
            let mut tokens = seqs[start].len();
            while end < seqs.len() && tokens + seqs[end].len() <= self.forward_tokens {
                tokens += seqs[end].len();
                end += 1;
            }
            let group: Vec<&[u32]> = seqs[start..end].iter().map(Vec::as_slice).collect();
            let states = self.encoder.encode(&group)?;
            for span in spans(&group) {
                let mut v = pool(&self.info.pooling, &states, span);
                if self.info.normalize {
                    l2_normalize(&mut v);
                }
                out.push(v);
            }
            start = end;
        }
        Ok(out)
    }
}
