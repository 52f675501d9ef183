//! One request's decoding state: its sampler, detokenizer, stop matcher and log-probability
//! record. Every front end (the scheduler behind `anelm serve`, [`crate::generate`] behind
//! `anelm generate`/`chat`/`bench`) turns a row of logits into the next token through
//! [`Stream::advance`], so they stop, mask and record the same way.

use anelm_model::tokenizer::{StreamDecoder, Tokenizer};

use crate::constraint::{Constraint, ConstraintError};
use crate::sampler::{Sampler, SamplerError, SamplerParams};
use crate::stop::StopMatcher;

/// Most alternatives a request may ask for per token (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Why a stream's generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was sampled.
    Stop,
    /// `max_tokens` or the context size was reached.
    Length,
    /// The caller asked to stop.
    Cancelled,
}

/// How one stream decodes.
#[derive(Clone, Debug)]
pub struct StreamOptions {
    /// Most tokens to generate (≥ 1).
    pub max_tokens: usize,
    /// Sampling parameters, including the stream's seed.
    pub sampler: SamplerParams,
    /// Strings that end generation (not included in the output).
    pub stop: Vec<String>,
    /// Never sample end-of-generation tokens (run to `max_tokens`).
    pub ignore_eos: bool,
    /// Record each generated token's log-probability and this many most likely alternatives
    /// (`Some(0)`: the chosen token's only); `None` records nothing.
    pub logprobs: Option<usize>,
    /// A grammar the output must match (compiled by [`crate::ConstraintFactory`]). It decides
    /// where end-of-generation tokens are allowed, so `ignore_eos` does not apply with it.
    pub constraint: Option<Constraint>,
}

/// Why a stream could not take its next token.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// Sampling failed (invalid parameters or no usable logit).
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    /// The output constraint failed.
    #[error(transparent)]
    Constraint(#[from] ConstraintError),
}

impl From<StreamError> for crate::EngineError {
    fn from(e: StreamError) -> Self {
        match e {
            StreamError::Sampler(e) => e.into(),
            StreamError::Constraint(e) => e.into(),
        }
    }
}

impl StreamOptions {
    /// Greedy decoding of at most `max_tokens`, nothing else.
    pub fn greedy(max_tokens: usize) -> Self {
        Self {
            max_tokens,
            sampler: SamplerParams::greedy(),
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            constraint: None,
        }
    }
}

/// A generated token's log-probability under the model (the log-softmax of its raw logits,
/// before penalties, temperature or masking), and the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token taken.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens at this position, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// What one [`Stream::advance`] produced.
#[derive(Clone, Debug, Default)]
pub struct StreamStep {
    /// Text now safe to show (held back while it could be part of a stop string or of a
    /// multi-byte character; everything held is released when the stream finishes).
    pub text: String,
    /// The token taken and to be fed to the model next, unless the stream finished on an
    /// end-of-generation token (which is not part of the output).
    pub token: Option<u32>,
    /// The token's log-probability, when the stream records them.
    pub logprob: Option<TokenLogprob>,
    /// Set when the stream ended with this step.
    pub finish: Option<FinishReason>,
    /// The step ran under a grammar and computed its full mask (the draw from the raw logits
    /// was refused, or could not be checked first).
    pub masked: bool,
}

/// One request's decoding state (see the module docs).
pub struct Stream<'t> {
    tokenizer: &'t Tokenizer,
    sampler: Sampler,
    decoder: StreamDecoder<'t>,
    stop: StopMatcher,
    max_tokens: usize,
    ignore_eos: bool,
    logprobs: Option<usize>,
    constraint: Option<Constraint>,
    /// Whether a constrained step may take the sampler's choice from the raw logits when the
    /// grammar allows it (see [`Stream::advance`]).
    check_first: bool,
    /// This step's first draw, made by [`Stream::prepare`], with the history length it was
    /// made at (a draw left from a step whose `advance` never came is not taken).
    drawn: Option<(usize, FirstDraw)>,
    generated: Vec<u32>,
    finished: Option<FinishReason>,
}

/// The outcome of a constrained step's first draw from the raw logits.
#[derive(Clone, Copy, Debug)]
enum FirstDraw {
    /// The grammar allows the token: the step takes it.
    Allowed(u32),
    /// The grammar refused it: the step masks and draws again.
    Refused,
}

impl<'t> Stream<'t> {
    /// A stream decoding with `tokenizer`'s vocabulary and end-of-generation tokens.
    pub fn new(tokenizer: &'t Tokenizer, opts: &StreamOptions) -> Result<Self, SamplerError> {
        Ok(Self {
            tokenizer,
            sampler: Sampler::new(opts.sampler.clone())?,
            decoder: StreamDecoder::new(tokenizer),
            stop: StopMatcher::new(&opts.stop),
            max_tokens: opts.max_tokens,
            ignore_eos: opts.ignore_eos,
            logprobs: opts.logprobs.map(|n| n.min(MAX_TOP_LOGPROBS)),
            constraint: opts.constraint.clone(),
            check_first: opts.constraint.as_ref().is_some_and(|c| !c.masks_every_step())
                && draw_then_check_is_exact(&opts.sampler),
            drawn: None,
            generated: Vec::new(),
            finished: None,
        })
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> &[u32] {
        &self.generated
    }

    /// Why the stream ended, once it has.
    pub fn finished(&self) -> Option<FinishReason> {
        self.finished
    }

    /// The stop string (of [`StreamOptions::stop`]) that ended the stream, if one did.
    pub fn stop_string(&self) -> Option<&str> {
        self.stop.matched()
    }

    /// Take the next token from `logits` (the model's raw next-token row; end-of-generation
    /// entries are masked in place when the stream ignores them). `history` is every token of
    /// the sequence so far (prompt and generated), for the penalties; `room` says whether the
    /// context can hold another token after this one. A finished stream takes no more tokens: it
    /// returns an empty step with its finish reason.
    ///
    /// Under a grammar, where that gives exactly the masked distribution (greedy, or plain
    /// temperature sampling), the sampler draws from the raw row first and the step keeps the
    /// token when the grammar allows it — a check of one token's bytes; only a refused draw
    /// pays for the full mask (a walk of the whole vocabulary) and a second draw. A model that
    /// mostly writes what the grammar wants then mostly skips the mask.
    pub fn advance(&mut self, logits: &mut [f32], history: &[u32], room: bool) -> Result<StreamStep, StreamError> {
        if let Some(why) = self.finished {
            return Ok(StreamStep {
                finish: Some(why),
                ..StreamStep::default()
            });
        }
        let record = self.logprobs.map(|top| LogSoftmax::of(logits).with_top(logits, top));
        let stops = self.tokenizer.stop_ids();
        let mut masked = false;
        let token = if let Some(c) = &mut self.constraint {
            let first = match self.drawn.take() {
                Some((at, d)) if at == history.len() => d,
                _ if self.check_first => first_draw(&mut self.sampler, c, logits, history)?,
                _ => FirstDraw::Refused,
            };
            match first {
                FirstDraw::Allowed(t) => t,
                FirstDraw::Refused => {
                    masked = true;
                    c.mask(logits)?;
                    self.sampler.sample(logits, history)?
                }
            }
        } else {
            if self.ignore_eos {
                for &s in stops {
                    if let Some(l) = logits.get_mut(s as usize) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            self.sampler.sample(logits, history)?
        };
        if stops.contains(&token) {
            return Ok(marked(
                masked,
                self.end(String::new(), None, None, FinishReason::Stop, false),
            ));
        }
        let grammar_done = match &mut self.constraint {
            Some(c) => {
                c.accept(token)?;
                c.is_finished()
            }
            None => false,
        };
        // The taken token's entry is never one the masking changed (masked entries cannot be
        // sampled), so it is still the raw logit.
        let logprob = record.map(|(norm, top)| TokenLogprob {
            token,
            logprob: norm.at(logits.get(token as usize).copied().unwrap_or(f32::NEG_INFINITY)),
            top,
        });
        self.generated.push(token);
        let piece = self.decoder.push(token);
        let s = self.stop.push(&piece);
        if s.stopped {
            return Ok(marked(
                masked,
                self.end(s.emit, Some(token), logprob, FinishReason::Stop, true),
            ));
        }
        if grammar_done {
            // Nothing but end-of-generation can follow: end here rather than spend a step on it.
            return Ok(marked(
                masked,
                self.end(s.emit, Some(token), logprob, FinishReason::Stop, false),
            ));
        }
        if self.generated.len() >= self.max_tokens || !room {
            return Ok(marked(
                masked,
                self.end(s.emit, Some(token), logprob, FinishReason::Length, false),
            ));
        }
        Ok(StreamStep {
            text: s.emit,
            token: Some(token),
            logprob,
            finish: None,
            masked,
        })
    }

    /// Do the grammar work of the next [`Stream::advance`] on the same `logits` and `history`
    /// (the first draw and its check, and the full mask where the grammar refuses it), so a
    /// scheduler can do it for several streams in parallel. Errors surface in `advance`, which
    /// then takes the same tokens as without this call.
    pub fn prepare(&mut self, logits: &[f32], history: &[u32]) {
        if self.finished.is_some() || self.drawn.is_some_and(|(at, _)| at == history.len()) {
            return;
        }
        let Some(c) = &mut self.constraint else {
            return;
        };
        if self.check_first {
            match first_draw(&mut self.sampler, c, logits, history) {
                Ok(d) => self.drawn = Some((history.len(), d)),
                Err(_) => return,
            }
        }
        if !matches!(self.drawn, Some((_, FirstDraw::Allowed(_)))) {
            let _ = c.prepare();
        }
    }

    /// Whether the stream has work for [`Stream::prepare`].
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// End the stream because its client went away: nothing held back is released.
    pub fn cancel(&mut self) {
        self.finished.get_or_insert(FinishReason::Cancelled);
    }

    /// Finish with `why`; `cut` says a stop string ended the text where it starts (what was
    /// held back is dropped), otherwise everything held back is released.
    fn end(
        &mut self,
        mut text: String,
        token: Option<u32>,
        logprob: Option<TokenLogprob>,
        why: FinishReason,
        cut: bool,
    ) -> StreamStep {
        let tail = self.decoder.finish();
        if cut {
            self.stop.finish();
        } else {
            let s = self.stop.push(&tail);
            text.push_str(&s.emit);
            text.push_str(&self.stop.finish());
        }
        self.finished = Some(why);
        StreamStep {
            text,
            token,
            logprob,
            finish: Some(why),
            masked: false,
        }
    }
}

/// `step`, noting whether it computed the grammar's full mask.
fn marked(masked: bool, step: StreamStep) -> StreamStep {
    StreamStep { masked, ..step }
}

/// Whether drawing from the raw logits and keeping the token when the grammar allows it (else
/// masking and drawing again) takes tokens with exactly the masked distribution's
/// probabilities. Greedy: an allowed argmax is the masked row's argmax (ties included, the
/// lower id wins in both). Plain temperature sampling: a token `t` is taken with probability
/// `p(t) + (1 − Z)·p(t)/Z = p(t)/Z` (`Z` the allowed mass), the masked softmax. Top-k, top-p and
/// min-p cut the row by its unmasked ranks, which the mask would change, so they always mask.
fn draw_then_check_is_exact(p: &SamplerParams) -> bool {
    p.is_greedy() || (p.top_k == 0 && p.top_p >= 1.0 && p.min_p <= 0.0)
}

/// Draw from the raw logits and ask the grammar whether the token may come next.
fn first_draw(
    sampler: &mut Sampler,
    constraint: &mut Constraint,
    logits: &[f32],
    history: &[u32],
) -> Result<FirstDraw, StreamError> {
    let t = sampler.sample(logits, history)?;
    Ok(match constraint.allows(t)? {
        true => FirstDraw::Allowed(t),
        false => FirstDraw::Refused,
    })
}

/// The normaliser of a row's log-softmax: `log p(i) = l(i) - max - ln Σ exp(l - max)`.
#[derive(Clone, Copy, Debug)]
pub struct LogSoftmax {
    max: f32,
    log_sum: f64,
}

impl LogSoftmax {
    /// The normaliser of `logits` (non-finite entries count as probability 0).
    pub fn of(logits: &[f32]) -> Self {
        let max = logits
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits
            .iter()
            .filter(|x| x.is_finite())
            .map(|&x| f64::from(x - max).exp())
            .sum();
        Self { max, log_sum: sum.ln() }
    }

    /// The log-probability of a logit.
    pub fn at(&self, logit: f32) -> f32 {
        if !logit.is_finite() {
            return f32::NEG_INFINITY;
        }
        (f64::from(logit - self.max) - self.log_sum) as f32
    }

    /// This normaliser with the `n` most likely entries of `logits` (ties: lower id first).
    fn with_top(self, logits: &[f32], n: usize) -> (Self, Vec<(u32, f32)>) {
        let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
        if n > 0 {
            for (id, &l) in (0u32..).zip(logits) {
                if !l.is_finite() || (top.len() == n && l <= top[n - 1].1) {
                    continue;
                }
                let at = top.partition_point(|&(_, x)| x >= l);
                top.insert(at, (id, l));
                top.truncate(n);
            }
        }
        let top = top.into_iter().map(|(id, l)| (id, self.at(l))).collect();
        (self, top)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_normalises_and_top_is_sorted_with_lower_ids_first_on_ties() {
        let logits = [1.0f32, 3.0, 3.0, f32::NEG_INFINITY, 0.5, 2.0];
        let (norm, top) = LogSoftmax::of(&logits).with_top(&logits, 3);
        let total: f64 = logits.iter().map(|&l| f64::from(norm.at(l)).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2, 5]);
        assert!(top.windows(2).all(|w| w[0].1 >= w[1].1));
        assert_eq!(norm.at(f32::NEG_INFINITY), f32::NEG_INFINITY);
        let (_, none) = LogSoftmax::of(&logits).with_top(&logits, 0);
        assert!(none.is_empty());
    }
}
