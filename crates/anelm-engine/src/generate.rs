//! Single-stream generation: prompt-cache-aware prefill in chunks, then sample → forward until
//! a stop token, the token budget or the caller says stop.

use std::time::{Duration, Instant};

use anelm_model::tokenizer::Tokenizer;

use crate::error::{EngineError, Result};
use crate::model::{LanguageModel, LogitsMode, StepItem};
use crate::sampler::SamplerParams;
use crate::session::Session;
use crate::speculate::{
    DraftBudget, Drafter, LookupOptions, MAX_DRAFT_TOKENS, Rollback, SpeculationStats, next_drafts, verify,
};
use crate::stream::{FinishReason, Stream, StreamOptions};

/// Prompt tokens per prefill pass unless told otherwise (`anelm generate`, `serve`, `chat` and
/// `bench`): small enough that a pass's activations stay in the caches (a Qwen3.5-0.8B-shaped
/// pp2048 runs ~7 % faster in passes of 128 than in one; docs/field-guide.md, 2026-12-08) and
/// that other streams wait little, large enough to read each weight once per 128 tokens.
pub const DEFAULT_PREFILL_CHUNK: usize = 128;

/// How to generate.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// How the stream decodes: token budget, sampling, stop strings, end-of-generation tokens
    /// (`ignore_eos` masks them, as llama.cpp's `--ignore-eos` does, so generation runs to
    /// `max_tokens` as benchmarks need), log-probabilities.
    pub stream: StreamOptions,
    /// Prompt tokens per prefill pass.
    pub prefill_chunk: usize,
    /// Draft tokens by prompt lookup and verify them in one pass ([`crate::speculate`]); the
    /// output is the same as without.
    pub speculate: Option<LookupOptions>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            stream: StreamOptions {
                max_tokens: 256,
                sampler: SamplerParams::default(),
                stop: Vec::new(),
                ignore_eos: false,
                logprobs: None,
                constraint: None,
            },
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            speculate: None,
        }
    }
}

/// Counts and timings of one generation.
#[derive(Clone, Debug)]
pub struct GenerationStats {
    /// Prompt tokens in the request.
    pub prompt_tokens: usize,
    /// Of those, tokens whose state was reused from the session (not prefilled again).
    pub reused_tokens: usize,
    /// Time to prefill the rest.
    pub prompt_time: Duration,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Time from the first sampled token to the last.
    pub generation_time: Duration,
    /// Of that, the time inside the model's decode forwards; the rest (sampling, detokenising,
    /// stop strings, the caller's handling of each piece, drafting) is outside the forward.
    pub forward_time: Duration,
    /// Why it ended.
    pub finish: FinishReason,
    /// Decode passes, drafted and accepted tokens (passes count without speculation too).
    pub speculation: SpeculationStats,
}

fn rate(n: usize, t: Duration) -> f64 {
    if t.is_zero() { 0.0 } else { n as f64 / t.as_secs_f64() }
}

impl GenerationStats {
    /// Prefilled tokens per second.
    pub fn prompt_tok_per_s(&self) -> f64 {
        rate(self.prompt_tokens - self.reused_tokens, self.prompt_time)
    }
    /// Generated tokens per second (decode steps only).
    pub fn generation_tok_per_s(&self) -> f64 {
        rate(self.generated_tokens.saturating_sub(1), self.generation_time)
    }

    /// Per generated token after the first: the time inside the decode forward and the time
    /// outside it (sampling, detokenising, stop strings, the caller's handling of the text).
    pub fn step_split(&self) -> (Duration, Duration) {
        let steps = self.generated_tokens.saturating_sub(1).max(1) as u32;
        let outside = self.generation_time.saturating_sub(self.forward_time);
        (self.forward_time / steps, outside / steps)
    }
}

/// Bring `session` to the state after `prompt` and return the last prompt token's logits.
/// Reuses the longest cached prefix; returns (logits, reused token count).
pub fn prefill(
    model: &dyn LanguageModel,
    session: &mut Session,
    prompt: &[u32],
    chunk: usize,
) -> Result<(Vec<f32>, usize)> {
    if prompt.is_empty() {
        return Err(EngineError::InvalidRequest("the prompt is empty (no tokens)".into()));
    }
    if prompt.len() > session.ctx_size() {
        return Err(EngineError::ContextFull {
            needed: prompt.len(),
            limit: session.ctx_size(),
        });
    }
    let mut common = session.tokens().iter().zip(prompt).take_while(|(a, b)| a == b).count();
    // The last prompt token must run again to produce its logits.
    common = common.min(prompt.len() - 1);
    // A recurrent session cannot rewind, so it may keep less than asked (everything or nothing).
    let common = session.truncate(common);
    let chunk = chunk.max(1);
    let rest = &prompt[common..];
    let mut logits = Vec::new();
    let n_chunks = rest.len().div_ceil(chunk);
    for (i, part) in rest.chunks(chunk).enumerate() {
        let last = i + 1 == n_chunks;
        let mut items = [StepItem {
            session,
            tokens: part,
            logits: if last { LogitsMode::Last } else { LogitsMode::None },
        }];
        let out = model.forward(&mut items)?;
        if last {
            logits = out.lane(0).to_vec();
        }
    }
    Ok((logits, common))
}

/// Generate after `prompt`, calling `on_text` with each piece of decoded text as soon as it is
/// complete (stop strings held back and cut, as the server does); `on_text` returns false to
/// stop. Returns the generated ids and the statistics.
///
/// Each decode pass feeds the token just taken and, with [`GenerateOptions::speculate`], the
/// tokens drafted after it; the stream takes tokens from the pass's rows while its own draws
/// agree with the drafts ([`verify`]), and the session drops the positions it did not keep.
pub fn generate(
    model: &dyn LanguageModel,
    tokenizer: &Tokenizer,
    session: &mut Session,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<(Vec<u32>, GenerationStats)> {
    let mut lookup = opts.speculate;
    if let Some(l) = &lookup {
        l.validate().map_err(EngineError::InvalidRequest)?;
    }
    let drafter = lookup.as_mut().map(|l| l as &mut dyn Drafter);
    generate_drafted(model, tokenizer, session, prompt, opts, drafter, on_text)
}

/// [`generate`] with the caller's drafter (a draft model, or a test's forced drafts); `opts`
/// must not also ask for lookup speculation.
pub fn generate_with_drafter(
    model: &dyn LanguageModel,
    tokenizer: &Tokenizer,
    session: &mut Session,
    prompt: &[u32],
    opts: &GenerateOptions,
    drafter: &mut dyn Drafter,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<(Vec<u32>, GenerationStats)> {
    if opts.speculate.is_some() {
        return Err(EngineError::InvalidRequest(
            "both a drafter and lookup speculation were given: choose one".into(),
        ));
    }
    generate_drafted(model, tokenizer, session, prompt, opts, Some(drafter), on_text)
}

fn generate_drafted(
    model: &dyn LanguageModel,
    tokenizer: &Tokenizer,
    session: &mut Session,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut drafter: Option<&mut dyn Drafter>,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<(Vec<u32>, GenerationStats)> {
    let mut stream = Stream::new(tokenizer, &opts.stream)?;
    let t0 = Instant::now();
    let (logits, reused) = prefill(model, session, prompt, opts.prefill_chunk)?;
    let prompt_time = t0.elapsed();
    let mut first_token_at = None;
    let mut spec = SpeculationStats::default();
    let ctx = session.ctx_size();
    // The rows to draw from and the tokens that produced them (the last prompt token first).
    let mut rows = crate::batch::Batch::from_vec(1, logits.len(), logits)
        .ok_or_else(|| EngineError::Config("the model returned no logits".into()))?;
    let mut fed: Vec<u32> = vec![prompt[prompt.len() - 1]];
    let mut rollback: Option<Rollback> = None;
    let mut budget = DraftBudget::default();
    let mut forward_time = Duration::ZERO;
    loop {
        let verified = verify(&mut stream, &mut rows, 0, &fed, session.tokens(), ctx, &mut |step| {
            step.text.is_empty() || on_text(&step.text)
        })?;
        first_token_at.get_or_insert_with(Instant::now);
        spec.accepted += verified.accepted;
        budget.update(fed.len() - 1, verified.accepted);
        // Keep the positions whose rows were used: the session then holds what it would hold
        // without speculation.
        if let Some(r) = rollback.take() {
            r.keep(model, session, verified.used)?;
        }
        let Some(tok) = verified.next else {
            stream.cancel(); // no-op when the stream finished by itself
            break;
        };
        let drafts = match drafter.as_deref_mut() {
            Some(d) => {
                let left = opts.stream.max_tokens.saturating_sub(stream.generated().len());
                next_drafts(d, &budget, session, tok, left, MAX_DRAFT_TOKENS)?
            }
            None => Vec::new(),
        };
        spec.passes += 1;
        spec.drafted += drafts.len();
        fed.clear();
        fed.push(tok);
        fed.extend_from_slice(&drafts);
        rollback = (!drafts.is_empty()).then(|| Rollback::before(&mut *session));
        let mut items = [StepItem {
            session,
            tokens: &fed,
            logits: if drafts.is_empty() {
                LogitsMode::Last
            } else {
                LogitsMode::All
            },
        }];
        let t = Instant::now();
        rows = model.forward(&mut items)?;
        forward_time += t.elapsed();
    }
    let generation_time = first_token_at.map_or(Duration::ZERO, |t| t.elapsed());
    let stats = GenerationStats {
        prompt_tokens: prompt.len(),
        reused_tokens: reused,
        prompt_time,
        generated_tokens: stream.generated().len(),
        generation_time,
        forward_time,
        finish: stream.finished().unwrap_or(FinishReason::Cancelled),
        speculation: spec,
    };
    Ok((stream.generated().to_vec(), stats))
}
