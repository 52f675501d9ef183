//! A draft model for speculative decoding: a smaller model sharing the target's tokenizer (a
//! Qwen3.5-0.8B beside a 4B or 9B, the same model quantised harder) proposes its own greedy
//! continuation, and the target checks it in one pass ([`crate::speculate`]). Greedy drafting
//! proposes one continuation, so the verification rule stays exact for greedy and sampled
//! decoding of the target alike.
//!
//! The draft keeps its own session: each call brings it to the history (reusing the common
//! prefix; a hybrid draft model returns to the checkpoint it saved where the last history
//! ended, so rejected drafts cost a short re-prefill, not the whole history) and then decodes
//! up to `limit` tokens one at a time.

use anelm_model::tokenizer::Tokenizer;

use crate::error::{EngineError, Result};
use crate::generate::prefill;
use crate::model::{LanguageModel, LogitsMode, StepItem};
use crate::sampler::argmax;
use crate::session::Session;
use crate::speculate::Drafter;

/// Prompt tokens per prefill pass of the draft model.
const DRAFT_PREFILL_CHUNK: usize = 128;

/// A [`Drafter`] backed by a model (see the module docs).
pub struct DraftModel<'m> {
    model: &'m dyn LanguageModel,
    session: Session,
    /// Drafts are limited to ids the target has.
    target_vocab: usize,
    /// Most tokens one call drafts (each costs a forward pass of the draft model).
    max_drafts: usize,
}

impl<'m> DraftModel<'m> {
    /// A drafter running `model` with a session of `ctx_size` positions, drafting at most
    /// `max_drafts` tokens per call, for a target whose vocabulary has `target_vocab` ids. Check
    /// the tokenizers first ([`check_same_vocabulary`]).
    pub fn new(model: &'m dyn LanguageModel, ctx_size: usize, target_vocab: usize, max_drafts: usize) -> Self {
        Self {
            session: model.new_session(ctx_size),
            model,
            target_vocab,
            max_drafts,
        }
    }
}

/// Refuse a draft model whose tokenizer does not give the same token for every id the two
/// vocabularies share (its drafts would be other text under the target's reading).
pub fn check_same_vocabulary(target: &Tokenizer, draft: &Tokenizer) -> Result<()> {
    let shared = target.vocab_size().min(draft.vocab_size());
    if shared == 0 {
        return Err(EngineError::InvalidRequest(
            "the draft model has an empty vocabulary".into(),
        ));
    }
    match (0..shared as u32).find(|&id| target.token_bytes_ref(id) != draft.token_bytes_ref(id)) {
        None => Ok(()),
        Some(id) => Err(EngineError::InvalidRequest(format!(
            "the draft model's tokenizer differs from the target's at token {id} ({:?} vs {:?}): a draft \
             model must share the target's tokenizer (a smaller model of the same family)",
            String::from_utf8_lossy(target.token_bytes_ref(id)),
            String::from_utf8_lossy(draft.token_bytes_ref(id))
        ))),
    }
}

impl Drafter for DraftModel<'_> {
    fn draft(&mut self, history: &[u32], limit: usize) -> Result<Vec<u32>> {
        let limit = limit
            .min(self.max_drafts)
            .min(self.session.ctx_size().saturating_sub(history.len()));
        if limit == 0 || history.is_empty() {
            return Ok(Vec::new());
        }
        let (mut logits, _) = prefill(self.model, &mut self.session, history, DRAFT_PREFILL_CHUNK)?;
        // A hybrid draft model can come back here after the target rejects some drafts.
        self.session.checkpoint();
        let mut drafts = Vec::with_capacity(limit);
        loop {
            let usable = logits.len().min(self.target_vocab);
            let best = argmax(&logits[..usable])
                .map(|i| i as u32)
                .ok_or_else(|| EngineError::InvalidRequest("the draft model returned no finite logits".into()))?;
            drafts.push(best);
            if drafts.len() == limit {
                return Ok(drafts);
            }
            let mut items = [StepItem {
                session: &mut self.session,
                tokens: std::slice::from_ref(&best),
                logits: LogitsMode::Last,
            }];
            logits = self.model.forward(&mut items)?.lane(0).to_vec();
        }
    }
}
