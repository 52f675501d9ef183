//! The plumbing every forward shares: which lane of a step is which session's token at which
//! position, embedding lookup, and which lanes' logits were asked for.

use crate::batch::Batch;
use crate::error::{EngineError, Result};
use crate::model::{LogitsMode, StepItem};
use crate::ops::Rope;
use crate::stored_matrix::StoredMatrix;

/// Where one lane of a step comes from.
#[derive(Clone, Copy, Debug)]
pub struct LaneRef {
    /// Index of the step item (session).
    pub item: usize,
    /// Absolute position of the token in its session.
    pub pos: usize,
    /// The context size of its session (Phi-3's long-RoPE factors apply to sessions longer
    /// than the original context).
    pub ctx: usize,
}

/// Validate a step and lay its tokens out as lanes: every item's tokens, in order.
pub(crate) fn plan_lanes(items: &[StepItem<'_>], vocab_size: usize) -> Result<Vec<LaneRef>> {
    let mut lanes = Vec::new();
    for (i, it) in items.iter().enumerate() {
        if it.tokens.is_empty() && it.logits != LogitsMode::None {
            return Err(EngineError::InvalidRequest(
                "a step item that asks for logits must carry at least one token".into(),
            ));
        }
        let needed = it.session.len() + it.tokens.len();
        if needed > it.session.ctx_size() {
            return Err(EngineError::ContextFull {
                needed,
                limit: it.session.ctx_size(),
            });
        }
        for (t, &tok) in it.tokens.iter().enumerate() {
            if tok as usize >= vocab_size {
                return Err(EngineError::InvalidRequest(format!(
                    "token id {tok} is outside the vocabulary (size {vocab_size})"
                )));
            }
            lanes.push(LaneRef {
                item: i,
                pos: it.session.len() + t,
                ctx: it.session.ctx_size(),
            });
        }
    }
    Ok(lanes)
}

/// Embedding rows of every lane's token (as f32), times `scale`.
pub(crate) fn embed_lanes(embed: &StoredMatrix, items: &[StepItem<'_>], n: usize, scale: f32) -> Result<Batch> {
    let mut x = Batch::zeros(n, embed.cols);
    let mut lane = 0;
    let mut buf = Vec::new();
    for it in items {
        for &tok in it.tokens {
            // Read through the store, not the mapping: the LM head's packed copy released these
            // pages, and faulting them back (with the kernel's read-around) would hold tens of
            // megabytes of the table resident again.
            let row = embed.read_row(tok as usize, &mut buf).unwrap_or(&[]);
            let dst = x.lane_mut(lane);
            anelm_kernels::dequantize_row(embed.format, row, dst)?;
            if scale != 1.0 {
                dst.iter_mut().for_each(|v| *v *= scale);
            }
            lane += 1;
        }
    }
    Ok(x)
}

/// Each lane's RoPE angles under `rope`, by its position.
pub(crate) fn lane_angles(rope: &Rope, lanes: &[LaneRef]) -> Vec<Vec<(f32, f32)>> {
    lane_angles_by(lanes, |_| rope)
}

/// Each lane's RoPE angles under the rotation `pick` chooses for it (Phi-3: by its session's
/// context), by its position.
pub(crate) fn lane_angles_by<'r>(lanes: &[LaneRef], pick: impl Fn(&LaneRef) -> &'r Rope) -> Vec<Vec<(f32, f32)>> {
    lanes
        .iter()
        .map(|l| {
            let mut cs = Vec::new();
            pick(l).angles(l.pos, &mut cs);
            cs
        })
        .collect()
}

/// Lanes whose logits the items asked for, in output order.
pub(crate) fn wanted_lanes(items: &[StepItem<'_>]) -> Vec<usize> {
    let mut wanted = Vec::new();
    let mut lane = 0;
    for it in items {
        let k = it.tokens.len();
        match it.logits {
            LogitsMode::None => {}
            LogitsMode::Last => wanted.push(lane + k - 1),
            LogitsMode::All => wanted.extend(lane..lane + k),
        }
        lane += k;
    }
    wanted
}

/// Record every item's tokens in its session once the step's state is written.
pub(crate) fn commit_tokens(items: &mut [StepItem<'_>]) {
    for it in items.iter_mut() {
        it.session.push_tokens(it.tokens);
    }
}
