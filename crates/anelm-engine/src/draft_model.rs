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
use crate::model::{LanguageModel, LogitsMode, StepItem};
use crate::sampler::argmax;
use crate::scheduler::common_prefix;
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
        let mut lanes = [DraftLane {
            session: &mut self.session,
            history,
            limit: limit.min(self.max_drafts),
        }];
        Ok(draft_lanes(self.model, &mut lanes, self.target_vocab)?
            .pop()
            .unwrap_or_default())
    }
}

/// One stream's share of a batched draft ([`draft_lanes`]).
pub struct DraftLane<'a> {
    /// The draft model's session for this stream.
    pub session: &'a mut Session,
    /// The sequence the drafts follow (the stream's prompt and every token taken so far).
    pub history: &'a [u32],
    /// Most tokens to draft.
    pub limit: usize,
}

/// Draft for several streams at once, one batched pass of the draft model per step: each lane's
/// session is brought to its history (reusing the common prefix; a hybrid session returns to the
/// checkpoint it saved where its last history ended, and saves one where this one ends) in
/// chunks of at most [`DRAFT_PREFILL_CHUNK`] tokens, then decodes its greedy continuation one
/// token per pass; lanes still catching up and lanes already decoding share the passes. Returns
/// each lane's drafts (empty where its limit, or the room left in its session, is 0), limited
/// to ids below `target_vocab`.
pub fn draft_lanes(
    model: &dyn LanguageModel,
    lanes: &mut [DraftLane<'_>],
    target_vocab: usize,
) -> Result<Vec<Vec<u32>>> {
    let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); lanes.len()];
    // Position `fed[i]` of lane i's history is the next to run.
    let mut limits = Vec::with_capacity(lanes.len());
    let mut fed = Vec::with_capacity(lanes.len());
    for lane in lanes.iter_mut() {
        let room = lane.session.ctx_size().saturating_sub(lane.history.len());
        let limit = if lane.history.is_empty() {
            0
        } else {
            lane.limit.min(room)
        };
        limits.push(limit);
        let common = if limit == 0 {
            0
        } else {
            let shared = common_prefix(lane.session.tokens(), lane.history);
            // The last history token runs again: its logits give the first draft.
            lane.session.truncate(shared.min(lane.history.len() - 1))
        };
        fed.push(common);
    }
    loop {
        // Each lane's next tokens: a catch-up chunk (logits only where it ends the history),
        // or its last draft while it may draft more.
        let mut feeds: Vec<(usize, usize, bool)> = Vec::with_capacity(lanes.len()); // lane, end, wants logits
        for (i, lane) in lanes.iter().enumerate() {
            if limits[i] == 0 {
                continue;
            }
            let len = lane.history.len();
            if fed[i] < len {
                let end = (fed[i] + DRAFT_PREFILL_CHUNK).min(len);
                feeds.push((i, end, end == len));
            } else if drafts[i].len() < limits[i] && !drafts[i].is_empty() {
                feeds.push((i, len, true));
            }
        }
        if feeds.is_empty() {
            return Ok(drafts);
        }
        let rows = {
            let mut items: Vec<StepItem<'_>> = Vec::with_capacity(feeds.len());
            let mut next = feeds.iter().peekable();
            for (i, lane) in lanes.iter_mut().enumerate() {
                let Some(&(_, end, last)) = next.next_if(|f| f.0 == i) else {
                    continue;
                };
                let tokens = if fed[i] < lane.history.len() {
                    &lane.history[fed[i]..end]
                } else {
                    &drafts[i][drafts[i].len() - 1..]
                };
                items.push(StepItem {
                    session: &mut *lane.session,
                    tokens,
                    logits: if last { LogitsMode::Last } else { LogitsMode::None },
                });
            }
            model.forward(&mut items)?
        };
        let mut row = 0;
        for &(i, end, last) in &feeds {
            let catching_up = fed[i] < lanes[i].history.len();
            if catching_up {
                fed[i] = end;
                if fed[i] == lanes[i].history.len() {
                    // A hybrid draft model can come back here after the target rejects some
                    // drafts.
                    lanes[i].session.checkpoint();
                }
            }
            if last {
                let l = rows.lane(row);
                row += 1;
                let usable = l.len().min(target_vocab);
                let best = argmax(&l[..usable])
                    .map(|t| t as u32)
                    .ok_or_else(|| EngineError::InvalidRequest("the draft model returned no finite logits".into()))?;
                drafts[i].push(best);
            }
        }
    }
}
