//! Speculative decoding in the plan: a stream that drafts `k` tokens (prompt lookup) has the
//! target check them as `k` extra lanes of its decode step, and a step's ANE time barely depends
//! on its lanes (it streams the same weights), so a stream gains tokens per step for little
//! extra ANE time; the host work grows with the lanes. The model: each drafted token is accepted
//! with probability `a`, independently, until the first rejection; a pass then yields
//! `1 + a + a² + … + a^k` tokens on average, and its cost is a decode step with `streams·(k+1)`
//! lanes ([`Plan::decode_cost`]). [`Plan::speculative_decode`] picks the best `k` (the runtime
//! adapts its draft length to the acceptance it sees).

use crate::chip::ChipProfile;
use crate::plan::Plan;
use crate::plan_host::HostOptions;

/// Acceptance assumed when none is given: the median over the prompts of
/// `scripts/bench-speculate.sh` on SmolLM2-135M and Gemma 3 270M (CPU, greedy; 2026-12-07),
/// drafted tokens accepted / drafted.
pub const DEFAULT_ACCEPTANCE: f64 = 0.74;

/// Most tokens a pass drafts in the plan (the runtime's default lookup cap).
pub const MAX_PLANNED_DRAFTS: usize = 8;

/// Expected tokens one pass yields with `drafts` drafted tokens each accepted with probability
/// `acceptance` until the first rejection, plus the token the pass samples itself.
pub fn tokens_per_pass(acceptance: f64, drafts: usize) -> f64 {
    let a = acceptance.clamp(0.0, 1.0);
    (0..=drafts).map(|i| a.powi(i as i32)).sum()
}

/// A modelled speculative decode: aggregate tokens/s and the draft length that gives it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpeculativeDecode {
    /// Tokens per second over all streams.
    pub tok_s: f64,
    /// Tokens drafted per stream per pass (0: speculation does not pay).
    pub drafts: usize,
    /// Expected tokens per stream per pass.
    pub tokens_per_pass: f64,
}

impl Plan {
    /// Modelled decode tokens/s for `streams` streams that each draft up to
    /// [`MAX_PLANNED_DRAFTS`] tokens per pass at `acceptance`, with the best draft length.
    pub fn speculative_decode(
        &self,
        chip: &ChipProfile,
        host: &HostOptions,
        streams: usize,
        acceptance: f64,
    ) -> SpeculativeDecode {
        let streams = streams.max(1);
        let with = |k: usize| {
            let per_pass = tokens_per_pass(acceptance, k);
            let step = self.decode_cost(chip, host, streams * (k + 1)).seconds();
            SpeculativeDecode {
                tok_s: streams as f64 * per_pass / step,
                drafts: k,
                tokens_per_pass: per_pass,
            }
        };
        // The fewest drafts among equally fast lengths.
        (1..=MAX_PLANNED_DRAFTS)
            .map(with)
            .fold(with(0), |best, s| if s.tok_s > best.tok_s { s } else { best })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_per_pass_is_the_geometric_sum() {
        assert_eq!(tokens_per_pass(0.0, 8), 1.0);
        assert_eq!(tokens_per_pass(1.0, 4), 5.0);
        assert!((tokens_per_pass(0.5, 3) - 1.875).abs() < 1e-12);
        assert_eq!(tokens_per_pass(0.9, 0), 1.0);
        assert_eq!(tokens_per_pass(-1.0, 3), 1.0, "clamped");
    }
}
