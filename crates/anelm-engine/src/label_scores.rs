//! Label probabilities from a causal language model in one forward (routing and tagging): after
//! each prompt, the next-token logits of each label's first token are read at the prompt's last
//! position, and the probabilities are the softmax over those logits only (they sum to 1 over
//! the labels), with each label token's log-probability over the whole vocabulary beside them
//! (how likely the model was to answer with any label at all). Labels must start with distinct
//! tokens.

use crate::error::{EngineError, Result};
use crate::last_logits::last_logits;
use crate::loader::LoadedModel;

/// The scores of one prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct LabelScores {
    /// Each label's probability among the labels (softmax over their first tokens' logits).
    pub probabilities: Vec<f32>,
    /// Each label's first token's log-probability over the whole vocabulary.
    pub logprobs: Vec<f32>,
    /// Prompt tokens read.
    pub tokens: usize,
}

/// The first token of each label, as the answer would start (no leading space: the answer
/// follows the prompt directly). Refused: an empty label, and two labels starting with the
/// same token (their probabilities could not be told apart).
pub fn label_first_tokens(model: &LoadedModel, labels: &[String]) -> Result<Vec<u32>> {
    let mut ids = Vec::with_capacity(labels.len());
    for (i, label) in labels.iter().enumerate() {
        let first = model
            .tokenizer
            .encode_no_special(label)?
            .first()
            .copied()
            .ok_or_else(|| EngineError::InvalidRequest(format!("label {i} is empty")))?;
        if let Some(j) = ids.iter().position(|&t| t == first) {
            return Err(EngineError::InvalidRequest(format!(
                "labels {j} ('{}') and {i} ('{label}') start with the same token, so one forward cannot tell them apart: make their first words differ",
                labels[j]
            )));
        }
        ids.push(first);
    }
    Ok(ids)
}

/// Each label's scores after each prompt (token ids), in one batched pass.
pub fn label_probabilities(model: &LoadedModel, prompts: &[Vec<u32>], labels: &[String]) -> Result<Vec<LabelScores>> {
    if labels.len() < 2 {
        return Err(EngineError::InvalidRequest("give at least two labels".into()));
    }
    let ids = label_first_tokens(model, labels)?;
    last_logits(model.model.as_ref(), prompts, |i, row| {
        let picked: Vec<f32> = ids
            .iter()
            .map(|&t| row.get(t as usize).copied().unwrap_or(f32::NEG_INFINITY))
            .collect();
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let log_z = f64::from(max)
            + row
                .iter()
                .map(|&l| (f64::from(l) - f64::from(max)).exp())
                .sum::<f64>()
                .ln();
        LabelScores {
            probabilities: crate::cross_encoder::softmax(&picked),
            logprobs: picked.iter().map(|&l| (f64::from(l) - log_z) as f32).collect(),
            tokens: prompts[i].len(),
        }
    })
}
