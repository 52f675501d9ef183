//! The trunk of a decoder embedder (Qwen3-Embedding style): any registered decoder
//! ([`crate::arch::registry`], loaded without its LM head) run over each input in its own
//! session, and the final-normed hidden states pooled (last token, or mean/max/first over all
//! tokens).
//!
//! Inputs are never padded: every input of a call is an item of the same batched forward (its
//! own session, so attention stays causal and inside the input), as many tokens per forward as
//! the backend's dispatch takes; an input longer than that continues in the next forward
//! (chunked prefill), so only real tokens are computed and the last token is always the input's
//! own last, whatever the lengths beside it.

use std::sync::Arc;

use anelm_model::gguf::GgufFile;
use anelm_model::hf_config::HfConfig;
use anelm_model::tensor_store::TensorStore;

use crate::arch::registry::{self, DecoderModel, Head};
use crate::backend::Backend;
use crate::batch::Batch;
use crate::error::{EngineError, Result};
use crate::model::{LogitsMode, StepItem};
use crate::pooling::{PoolingMode, pool};
use crate::prefixed_store::PrefixedStore;

/// A loaded decoder trunk.
pub struct DecoderTrunk {
    model: Box<dyn DecoderModel>,
    /// Most tokens per forward.
    step_tokens: usize,
}

/// Most tokens one forward takes when the backend's dispatch is larger (the CPU's 512 lanes).
const MAX_STEP_TOKENS: usize = 2048;

impl DecoderTrunk {
    /// Load a decoder's `config.json` (`qwen3`, `llama`, … any registered architecture) from
    /// `store`, without its LM head. A trunk saved without the causal-LM `model.` prefix
    /// (sentence-transformers saves a bare `Qwen3Model`) is read through it.
    pub fn load(
        hf: &HfConfig,
        store: Arc<dyn TensorStore>,
        backend: &dyn Backend,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let arch = registry::for_hf(&hf.model_type)?;
        let store: Arc<dyn TensorStore> =
            if !store.contains("model.embed_tokens.weight") && store.contains("embed_tokens.weight") {
                Arc::new(PrefixedStore::new(store, "model."))
            } else {
                store
            };
        let model = (arch.load_hf)(hf, &store, backend, Head::HiddenStates, progress)?;
        Ok(Self::with_model(model, backend))
    }

    /// Load a decoder's GGUF without its LM head (embedding models' GGUFs have none).
    pub fn load_gguf(
        gguf: &Arc<GgufFile>,
        backend: &dyn Backend,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let arch = registry::for_gguf(gguf.architecture().unwrap_or(""))?;
        let model = (arch.load_gguf)(gguf, backend, Head::HiddenStates, progress)?;
        Ok(Self::with_model(model, backend))
    }

    fn with_model(model: Box<dyn DecoderModel>, backend: &dyn Backend) -> Self {
        Self {
            model,
            step_tokens: backend.max_lanes().clamp(1, MAX_STEP_TOKENS),
        }
    }

    /// Hidden width (the length of one pooled vector per mode).
    pub fn hidden_size(&self) -> usize {
        self.model.info().hidden_size
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.model.info().vocab_size
    }

    /// Training context length.
    pub fn context_length(&self) -> usize {
        self.model.info().context_length
    }

    /// One pooled vector per sequence (`modes` concatenated in order). Each sequence must be
    /// non-empty, within the context length, every id inside the vocabulary.
    pub fn embed(&self, seqs: &[&[u32]], modes: &[PoolingMode]) -> Result<Vec<Vec<f32>>> {
        let ctx = self.context_length().max(1);
        for s in seqs {
            if s.is_empty() {
                return Err(EngineError::InvalidRequest("an input has no tokens".into()));
            }
            if s.len() > ctx {
                return Err(EngineError::InvalidRequest(format!(
                    "an input has {} tokens, the model takes at most {ctx}",
                    s.len()
                )));
            }
        }
        let h = self.hidden_size();
        // Last-token pooling needs one row per input; the other modes every row.
        let all_rows = modes.iter().any(|&m| m != PoolingMode::LastToken);
        let mut sessions: Vec<_> = seqs.iter().map(|s| self.model.new_session(s.len())).collect();
        // Rows kept per input: all of them, or its last.
        let mut rows: Vec<Vec<f32>> = seqs.iter().map(|_| Vec::new()).collect();
        let mut done = vec![0usize; seqs.len()];
        // Bidirectional attention (EmbeddingGemma) sees the whole input at once: never split one.
        let whole = self.model.bidirectional();
        let mut next = 0;
        while next < seqs.len() {
            // The inputs from `next` on, each with as many of its remaining tokens as fit.
            let mut budget = self.step_tokens;
            let mut items = Vec::new();
            let mut owners = Vec::new();
            for (i, session) in sessions.iter_mut().enumerate().skip(next) {
                if budget == 0 {
                    break;
                }
                let remaining = seqs[i].len() - done[i];
                if whole && remaining > budget && !items.is_empty() {
                    break;
                }
                // An input longer than a forward's budget with bidirectional attention runs
                // alone, whole (the kernels split their dispatches themselves).
                let take = if whole { remaining } else { remaining.min(budget) };
                let finishes = done[i] + take == seqs[i].len();
                let logits = match (all_rows, finishes) {
                    (true, _) => LogitsMode::All,
                    (false, true) => LogitsMode::Last,
                    (false, false) => LogitsMode::None,
                };
                items.push(StepItem {
                    session,
                    tokens: &seqs[i][done[i]..done[i] + take],
                    logits,
                });
                owners.push((i, take, logits));
                budget = budget.saturating_sub(take);
            }
            let states = self.model.hidden_states(&mut items)?;
            drop(items);
            let mut row = 0;
            for (i, take, logits) in owners {
                let n = match logits {
                    LogitsMode::All => take,
                    LogitsMode::Last => 1,
                    LogitsMode::None => 0,
                };
                for r in row..row + n {
                    rows[i].extend_from_slice(states.lane(r));
                }
                row += n;
                done[i] += take;
                if done[i] == seqs[i].len() {
                    next = next.max(i + 1);
                }
            }
        }
        rows.into_iter()
            .map(|r| {
                let lanes = r.len() / h.max(1);
                let b = Batch::from_vec(lanes, h, r)
                    .ok_or_else(|| EngineError::Config("hidden states of an unexpected width".into()))?;
                Ok(pool(modes, &b, 0..lanes))
            })
            .collect()
    }
}
