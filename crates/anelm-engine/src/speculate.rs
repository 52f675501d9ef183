//! Speculative decoding by prompt lookup: draft the next tokens by finding the sequence's last
//! few tokens earlier in the sequence (the prompt or the output so far) and copying what
//! followed them, then let the model check every drafted token in one forward pass (they ride
//! as extra lanes of the step, which cost little where decode is bound by reading the weights).
//!
//! The drafter proposes one fixed continuation, so its "distribution" is a point mass and the
//! standard rejection rule (accept draft `d` with probability `min(1, p(d)/q(d)) = p(d)`, else
//! draw from `p` without `d`, renormalised) is exactly "draw from `p` as usual and keep the
//! draft while the draw equals it": the draw is the model's own, so greedy output is the output
//! without speculation and sampled output has the model's exact distribution (the sampler also
//! consumes its random numbers exactly as it would without speculation). [`verify`] runs that
//! rule through [`Stream::advance`], so stop strings, grammars, penalties and log-probabilities
//! behave as in plain decoding.
//!
//! Rejected positions are rolled back: an attention session's KV cache rewinds; a hybrid
//! session's recurrent state (which cannot rewind) is restored from a copy taken before the
//! pass and advanced again over the kept lanes from the inputs the pass recorded
//! ([`Rollback`], [`crate::arch::deltanet::LaneTrace`]).

use crate::error::Result;
use crate::model::{LanguageModel, LogitsMode, StepItem};
use crate::session::{RecurrentLayer, Session};
use crate::stream::{Stream, StreamStep};

/// Most tokens one verification pass may draft (a sliding-window KV ring keeps 64 positions of
/// slack for rewinds; the pass also needs one lane for the token it feeds).
pub const MAX_DRAFT_TOKENS: usize = 32;

/// How prompt-lookup drafting searches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LookupOptions {
    /// Most tokens drafted per pass (1..=[`MAX_DRAFT_TOKENS`]).
    pub draft_tokens: usize,
    /// Longest suffix looked up (tried first).
    pub max_ngram: usize,
    /// Shortest suffix looked up.
    pub min_ngram: usize,
}

impl Default for LookupOptions {
    fn default() -> Self {
        Self {
            draft_tokens: 8,
            max_ngram: 3,
            min_ngram: 1,
        }
    }
}

impl LookupOptions {
    /// Refuse values that cannot work, saying which.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if !(1..=MAX_DRAFT_TOKENS).contains(&self.draft_tokens) {
            return Err(format!(
                "draft tokens must be 1..={MAX_DRAFT_TOKENS}, not {}",
                self.draft_tokens
            ));
        }
        if self.min_ngram == 0 || self.min_ngram > self.max_ngram {
            return Err(format!(
                "the lookup n-gram range must satisfy 1 <= min ({}) <= max ({})",
                self.min_ngram, self.max_ngram
            ));
        }
        Ok(())
    }

    /// Up to `limit` (capped at `draft_tokens`) tokens that followed an earlier occurrence of
    /// `history`'s last n tokens, for n from `max_ngram` down to `min_ngram`: the latest
    /// occurrence followed by `limit` tokens, else the earliest (which has the most after it, as
    /// in a loop the output repeats); empty when no suffix occurs earlier.
    pub fn draft(&self, history: &[u32], limit: usize) -> Vec<u32> {
        let limit = limit.min(self.draft_tokens);
        if limit == 0 {
            return Vec::new();
        }
        let len = history.len();
        for n in (self.min_ngram..=self.max_ngram).rev() {
            if n >= len {
                continue;
            }
            let suffix = &history[len - n..];
            // Starts before the suffix's own, so at least one token follows each match.
            let mut earliest = None;
            for start in (0..len - n).rev() {
                if &history[start..start + n] == suffix {
                    earliest = Some(start + n);
                    if start + n + limit <= len {
                        break;
                    }
                }
            }
            if let Some(from) = earliest {
                return history[from..(from + limit).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

impl Drafter for LookupOptions {
    fn draft(&mut self, history: &[u32], limit: usize) -> Result<Vec<u32>> {
        Ok(LookupOptions::draft(self, history, limit))
    }
}

/// Proposes the tokens a stream may take next, for the model to verify in one pass. A drafter
/// proposes one continuation (no distribution), which is what makes [`verify`]'s rule exact.
pub trait Drafter {
    /// Up to `limit` tokens to follow `history` (the prompt and every token taken so far).
    fn draft(&mut self, history: &[u32], limit: usize) -> Result<Vec<u32>>;
}

/// Where a stream's drafts come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drafting {
    /// Prompt lookup with these options.
    Lookup(LookupOptions),
    /// The scheduler's draft model ([`crate::SchedulerConfig::draft_model`]).
    Model,
}

/// Whether one scheduler request drafts tokens ([`crate::Request::speculate`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Speculation {
    /// As the scheduler's configuration says ([`crate::SchedulerConfig::speculate`]).
    #[default]
    ServerDefault,
    /// Never: one token per pass.
    Off,
    /// Prompt lookup with these options.
    Lookup(LookupOptions),
    /// The scheduler's draft model (refused when it has none).
    Model,
}

impl Speculation {
    /// The drafting that applies, given the scheduler's default.
    pub fn resolve(self, default: Option<Drafting>) -> Option<Drafting> {
        match self {
            Speculation::ServerDefault => default,
            Speculation::Off => None,
            Speculation::Lookup(o) => Some(Drafting::Lookup(o)),
            Speculation::Model => Some(Drafting::Model),
        }
    }
}

/// Counts of one generation's speculation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpeculationStats {
    /// Decode forward passes (each verifies its drafts and feeds one token).
    pub passes: usize,
    /// Tokens drafted.
    pub drafted: usize,
    /// Drafted tokens the model's own draw agreed with.
    pub accepted: usize,
}

impl SpeculationStats {
    /// Accepted / drafted (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// How many tokens the next pass may draft: halved after a pass whose drafts were all
/// rejected, doubled (up to [`MAX_DRAFT_TOKENS`]; the drafter has its own cap) after one whose
/// drafts were all accepted; after a rejected single draft no drafting for [`DraftBudget::REST`]
/// passes, then one token again. Text the drafter cannot predict (a one-word answer, new prose)
/// then costs few wasted lanes, while text it can (a copy, a rewrite) gets long drafts.
#[derive(Clone, Copy, Debug)]
pub struct DraftBudget {
    limit: usize,
    resting: usize,
}

impl Default for DraftBudget {
    fn default() -> Self {
        Self {
            limit: MAX_DRAFT_TOKENS,
            resting: 0,
        }
    }
}

impl DraftBudget {
    /// Passes without drafts after a rejected single draft.
    pub const REST: usize = 4;

    /// Tokens the next pass may draft (0 while resting).
    pub fn limit(&self) -> usize {
        if self.resting > 0 { 0 } else { self.limit }
    }

    /// Learn from a pass that drafted `drafted` tokens and kept `accepted`.
    pub fn update(&mut self, drafted: usize, accepted: usize) {
        if self.resting > 0 {
            self.resting -= 1;
        } else if drafted > 0 && accepted == 0 {
            if drafted == 1 {
                self.resting = Self::REST;
            }
            self.limit = (drafted / 2).max(1);
        } else if drafted > 0 && accepted == drafted {
            self.limit = (drafted * 2).min(MAX_DRAFT_TOKENS);
        }
    }
}

/// What a session needs to undo a verification pass's rejected positions.
pub struct Rollback {
    len: usize,
    recurrent: Option<Vec<RecurrentLayer>>,
}

impl Rollback {
    /// Note `session`'s state before a pass: for a recurrent session, a copy of its state, and
    /// its layers start recording the pass's lane inputs.
    pub fn before(session: &mut Session) -> Self {
        let recurrent = session.is_recurrent().then(|| session.recurrent.clone());
        if recurrent.is_some() {
            session.start_trace();
        }
        Self {
            len: session.len(),
            recurrent,
        }
    }

    /// Keep only the first `keep` of the tokens the pass appended. An attention session rewinds
    /// its caches; a recurrent one goes back to the copy and advances it over the kept lanes'
    /// recorded inputs (no forward pass); a session that could not rewind runs again what it
    /// lost.
    pub fn keep(self, model: &dyn LanguageModel, session: &mut Session, keep: usize) -> Result<()> {
        let target = self.len + keep;
        if target >= session.len() {
            session.stop_trace();
            return Ok(());
        }
        // What may have to run again: the kept tokens of the pass (a recurrent session without
        // a record of them), or, when the caches cannot rewind at all (rare), everything.
        let from = if session.kv.can_truncate(target) { self.len } else { 0 };
        let tokens = session.tokens()[from..target].to_vec();
        let kept = match self.recurrent {
            None => session.truncate(target),
            Some(state) => session.rollback_recurrent(self.len, keep, state),
        };
        let Some(rest) = kept.checked_sub(from).and_then(|k| tokens.get(k..)) else {
            return Err(crate::error::EngineError::Config(format!(
                "a speculative rollback kept {kept} positions, fewer than the {from} it can run again"
            )));
        };
        for chunk in rest.chunks(REPLAY_CHUNK) {
            let mut items = [StepItem {
                session: &mut *session,
                tokens: chunk,
                logits: LogitsMode::None,
            }];
            model.forward(&mut items)?;
        }
        Ok(())
    }
}

/// Tokens per pass when a rollback runs positions again.
const REPLAY_CHUNK: usize = 128;

/// How a stream took tokens from a pass's rows ([`verify`]).
pub struct Verified {
    /// Rows used: the positions of the pass the session keeps.
    pub used: usize,
    /// Drafts the stream's own draws agreed with.
    pub accepted: usize,
    /// The token to feed next; `None` when the stream ended (it finished, or `on_step` said
    /// stop).
    pub next: Option<u32>,
}

/// Take tokens from a pass's rows, as plain decoding would: rows `first..` of `rows` follow the
/// `fed` tokens (the token fed, then its drafts), and `tokens` is the session's sequence, which
/// ends with `fed`. The stream draws from each row as usual ([`Stream::advance`], with the
/// sequence up to that row as its history), `on_step` gets every step (false: stop), and the
/// pass moves to the next row only while the draw equals the next drafted token.
pub fn verify(
    stream: &mut Stream<'_>,
    rows: &mut crate::batch::Batch,
    first: usize,
    fed: &[u32],
    tokens: &[u32],
    ctx: usize,
    on_step: &mut dyn FnMut(StreamStep) -> bool,
) -> std::result::Result<Verified, crate::stream::StreamError> {
    let base = tokens.len() - fed.len();
    let mut accepted = 0;
    for j in 0..fed.len() {
        // Row j follows fed[j], at position base + j; room for the token it gives after it.
        let end = base + j + 1;
        let step = stream.advance(rows.lane_mut(first + j), &tokens[..end], end < ctx)?;
        let (token, done) = (step.token, step.finish.is_some());
        if !on_step(step) || done {
            return Ok(Verified {
                used: j + 1,
                accepted,
                next: None,
            });
        }
        if token.is_some() && fed.get(j + 1) == token.as_ref() {
            accepted += 1;
            continue;
        }
        return Ok(Verified {
            used: j + 1,
            accepted,
            next: token,
        });
    }
    // No rows: nothing fed.
    Ok(Verified {
        used: 0,
        accepted: 0,
        next: None,
    })
}

/// How many drafts may follow `next`, the token a stream takes next: at most what `budget` and
/// `cap` allow, one fewer than the `left` tokens the stream may still take, and what the
/// session's context holds after `next`.
pub fn draft_limit(budget: &DraftBudget, session: &Session, left: usize, cap: usize) -> usize {
    let room = session.ctx_size().saturating_sub(session.len() + 1);
    budget.limit().min(cap).min(left.saturating_sub(1)).min(room)
}

/// The sequence a stream's drafts follow: the session's tokens, then `next`.
pub fn draft_history(session: &Session, next: u32) -> Vec<u32> {
    let mut history = Vec::with_capacity(session.len() + 1);
    history.extend_from_slice(session.tokens());
    history.push(next);
    history
}

/// The drafts to feed after `next` ([`draft_limit`] of them at most).
pub fn next_drafts(
    drafter: &mut dyn Drafter,
    budget: &DraftBudget,
    session: &Session,
    next: u32,
    left: usize,
    cap: usize,
) -> Result<Vec<u32>> {
    let limit = draft_limit(budget, session, left, cap);
    if limit == 0 {
        return Ok(Vec::new());
    }
    let mut drafts = drafter.draft(&draft_history(session, next), limit)?;
    drafts.truncate(limit);
    Ok(drafts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_copies_what_followed_the_latest_match() {
        let o = LookupOptions {
            draft_tokens: 3,
            max_ngram: 2,
            min_ngram: 1,
        };
        // "1 2" occurs at 0 and 4; the latest earlier one (4) is followed by three tokens.
        assert_eq!(o.draft(&[1, 2, 3, 4, 1, 2, 9, 8, 1, 2], 10), vec![9, 8, 1]);
        // The bigram "5 2" never occurs earlier: the unigram "2" does (latest at 6).
        assert_eq!(o.draft(&[1, 2, 7, 2, 6, 6, 2, 4, 5, 2], 10), vec![4, 5, 2]);
        // A limit below draft_tokens, and nothing to find.
        assert_eq!(o.draft(&[1, 2, 3, 1, 2], 1), vec![3]);
        assert!(o.draft(&[1, 2, 3, 4], 10).is_empty());
        assert!(o.draft(&[1, 2, 1, 2], 0).is_empty());
        assert!(o.draft(&[], 4).is_empty());
    }

    #[test]
    fn a_match_may_end_at_the_suffix_start() {
        let o = LookupOptions {
            draft_tokens: 4,
            max_ngram: 1,
            min_ngram: 1,
        };
        // The only earlier "7" is right before the last one: it is followed by that 7 itself.
        assert_eq!(o.draft(&[3, 7, 7], 4), vec![7]);
        // In a loop the latest match has one token after it: the earliest has the most.
        assert_eq!(o.draft(&[3, 7, 7, 7, 7, 7], 3), vec![7, 7, 7]);
        let o = LookupOptions { max_ngram: 2, ..o };
        assert_eq!(
            o.draft(&[5, 6, 5, 6, 5, 6], 2),
            vec![5, 6],
            "the latest with two after it"
        );
        assert_eq!(
            o.draft(&[5, 6, 5, 6, 5, 6], 4),
            vec![5, 6, 5, 6],
            "the earliest, with four"
        );
    }

    #[test]
    fn the_draft_budget_follows_the_acceptance() {
        let mut b = DraftBudget::default();
        assert_eq!(b.limit(), MAX_DRAFT_TOKENS);
        b.update(8, 0);
        assert_eq!(b.limit(), 4);
        b.update(4, 0);
        b.update(2, 0);
        assert_eq!(b.limit(), 1);
        // A rejected single draft rests for REST passes, then tries one token again.
        b.update(1, 0);
        for _ in 0..DraftBudget::REST {
            assert_eq!(b.limit(), 0);
            b.update(0, 0);
        }
        assert_eq!(b.limit(), 1);
        b.update(1, 1);
        assert_eq!(b.limit(), 2);
        b.update(2, 1);
        assert_eq!(b.limit(), 2, "a partial acceptance keeps it");
        b.update(0, 0);
        assert_eq!(b.limit(), 2, "a pass without drafts says nothing");
        for _ in 0..10 {
            let l = b.limit();
            b.update(l, l);
        }
        assert_eq!(b.limit(), MAX_DRAFT_TOKENS);
    }

    #[test]
    fn bad_options_are_refused() {
        let base = LookupOptions::default();
        assert!(base.validate().is_ok());
        for bad in [
            LookupOptions {
                draft_tokens: 0,
                ..base
            },
            LookupOptions {
                draft_tokens: MAX_DRAFT_TOKENS + 1,
                ..base
            },
            LookupOptions { min_ngram: 0, ..base },
            LookupOptions {
                min_ngram: 4,
                max_ngram: 3,
                ..base
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
