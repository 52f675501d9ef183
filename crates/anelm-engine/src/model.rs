//! The interface every architecture implements, and the request shape of one forward step.

use crate::backend::ForwardCost;
use crate::batch::Batch;
use crate::error::Result;
use crate::session::Session;

/// Which logits a step item wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsMode {
    /// None (a prefill chunk that is not the prompt's last).
    None,
    /// The last token's row only.
    Last,
    /// One row per token.
    All,
}

/// One session's share of a forward step: the tokens it appends (one for decode, a chunk for prefill).
pub struct StepItem<'a> {
    /// The session whose caches grow by `tokens.len()` positions.
    pub session: &'a mut Session,
    /// Tokens to append at positions `session.len()..`.
    pub tokens: &'a [u32],
    /// Logit rows wanted.
    pub logits: LogitsMode,
}

/// What a user-facing tool needs to know about a loaded model.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// Architecture name (`llama`, ...).
    pub architecture: String,
    /// Vocabulary size (logit row width).
    pub vocab_size: usize,
    /// Context length the model was trained for.
    pub context_length: usize,
    /// Layers.
    pub n_layers: usize,
    /// Hidden width.
    pub hidden_size: usize,
}

/// A causal language model on some backend.
pub trait LanguageModel: Send + Sync {
    /// Facts about the model.
    fn info(&self) -> &ModelInfo;
    /// A fresh session of up to `ctx_size` positions.
    fn new_session(&self, ctx_size: usize) -> Session;
    /// Run one step for every item (all their tokens as lanes of one batched pass) and return
    /// the requested logit rows, items in order, tokens in order within an item, with what the
    /// pass's kernels cost.
    fn forward_with_cost(&self, items: &mut [StepItem<'_>]) -> Result<(Batch, ForwardCost)>;

    /// [`LanguageModel::forward_with_cost`] for callers that do not time it.
    fn forward(&self, items: &mut [StepItem<'_>]) -> Result<Batch> {
        self.forward_with_cost(items).map(|(logits, _)| logits)
    }
}
