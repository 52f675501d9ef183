//! The logits at the last position of each of many prompts, from a causal language model in
//! one batched pass: every prompt is its own session and an item of the same forwards (as many
//! tokens per forward as [`STEP_TOKENS`]; a longer prompt continues in the next forward), with
//! only the final position's logit row asked for, each row reduced by the caller as soon as it
//! is computed (a vocabulary-sized row per prompt is never held). What decoder rerankers and
//! label scoring read.

use crate::error::{EngineError, Result};
use crate::model::{LanguageModel, LogitsMode, StepItem};
use crate::session::Session;

/// Most prompt tokens one forward takes.
pub const STEP_TOKENS: usize = 512;

/// `reduce(i, row)` of the last position's logit row of each of `prompts` (non-empty, each
/// within the model's context length), in prompt order.
pub fn last_logits<T>(
    model: &dyn LanguageModel,
    prompts: &[Vec<u32>],
    mut reduce: impl FnMut(usize, &[f32]) -> T,
) -> Result<Vec<T>> {
    let ctx = model.info().context_length.max(1);
    let vocab = model.info().vocab_size;
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(EngineError::InvalidRequest(format!("prompt {i} has no tokens")));
        }
        if p.len() > ctx {
            return Err(EngineError::InvalidRequest(format!(
                "prompt {i} has {} tokens; the model's context is {ctx}",
                p.len()
            )));
        }
        if let Some(&t) = p.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {t} is outside the vocabulary (size {vocab})"
            )));
        }
    }
    // Sessions exist only while their prompt is in flight, so the caches held at once stay
    // within about one forward's tokens.
    let mut sessions: Vec<Option<Session>> = prompts.iter().map(|_| None).collect();
    let mut rows: Vec<Option<T>> = prompts.iter().map(|_| None).collect();
    let mut done = vec![0usize; prompts.len()];
    let mut next = 0;
    while next < prompts.len() {
        let mut budget = STEP_TOKENS;
        let mut owners = Vec::new();
        for (i, p) in prompts.iter().enumerate().skip(next) {
            if budget == 0 {
                break;
            }
            let take = (p.len() - done[i]).min(budget);
            owners.push((i, take, done[i] + take == p.len()));
            budget -= take;
        }
        for &(i, _, _) in &owners {
            if sessions[i].is_none() {
                sessions[i] = Some(model.new_session(prompts[i].len()));
            }
        }
        let first = owners.first().map_or(next, |o| o.0);
        let last = owners.last().map_or(next, |o| o.0);
        let mut items: Vec<StepItem<'_>> = sessions[first..=last]
            .iter_mut()
            .zip(first..)
            .filter_map(|(s, i)| {
                let (_, take, finishes) = owners.iter().find(|o| o.0 == i).copied()?;
                Some(StepItem {
                    session: s.as_mut()?,
                    tokens: &prompts[i][done[i]..done[i] + take],
                    logits: if finishes { LogitsMode::Last } else { LogitsMode::None },
                })
            })
            .collect();
        let logits = model.forward(&mut items)?;
        drop(items);
        let mut row = 0;
        for (i, take, finishes) in owners {
            done[i] += take;
            if finishes {
                rows[i] = Some(reduce(i, logits.lane(row)));
                row += 1;
                sessions[i] = None;
                next = next.max(i + 1);
            }
        }
    }
    // Every prompt finishes in some forward (each is non-empty and fits).
    rows.into_iter()
        .map(|r| r.ok_or_else(|| EngineError::InvalidRequest("a prompt produced no logits".into())))
        .collect()
}
