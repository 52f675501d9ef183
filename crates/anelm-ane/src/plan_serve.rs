//! A serving benchmark's aggregate rate from the plan: what the C++ system's
//! `benchmark_parallel.py` reports (`ane-runtime.md` §10.1, in `docs/reference/`), Σ generated
//! tokens ÷ total wall time, for requests that each prefill a prompt and then decode in
//! lock-step with the others.
//!
//! Its serve loop (§7.2, main) prefills each new request **inline**, blocking every other
//! session, then decodes all active requests in one batched step. So the wall time is every
//! request's prefill, one after the other, plus the decode steps: `requests / streams` waves of
//! `max_tokens` steps at the plan's rate for `streams` streams. A model whose prefill is about as
//! slow as its decode (Qwen3.5-9B: 7.39 against 7.01 tok/s) spends a large share of the
//! benchmark prefilling, which a decode-only figure leaves out.

use crate::chip::ChipProfile;
use crate::plan::Plan;
use crate::plan_host::HostOptions;

/// The load a serving benchmark puts on the server.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServeLoad {
    /// Requests in the benchmark.
    pub requests: usize,
    /// Prompt tokens of each request, chat template included.
    pub prompt_tokens: f64,
    /// Tokens each request generates.
    pub max_tokens: usize,
}

impl ServeLoad {
    /// `benchmark_parallel.py` as the C++ README's serve table ran it: 8 requests of 100
    /// tokens. The prompt length is not published; `prompt_tokens` is a parameter.
    pub fn cpp_readme(prompt_tokens: f64) -> ServeLoad {
        ServeLoad {
            requests: 8,
            prompt_tokens,
            max_tokens: 100,
        }
    }

    /// Wall seconds of the benchmark at `streams` concurrent requests, from the plan's decode
    /// rate for that many streams and its prefill rate.
    pub fn wall_seconds(&self, plan: &Plan, chip: &ChipProfile, host: &HostOptions, streams: usize) -> f64 {
        let streams = streams.clamp(1, self.requests.max(1));
        let waves = self.requests.div_ceil(streams) as f64;
        let per_stream = plan.decode_tok_s(chip, host, streams) / streams as f64;
        let decode = waves * self.max_tokens as f64 / per_stream;
        let prefill = self.requests as f64 * self.prompt_tokens / plan.prefill_tok_s(chip, host);
        decode + prefill
    }

    /// Aggregate generated tokens/s at `streams` concurrent requests.
    pub fn aggregate_tok_s(&self, plan: &Plan, chip: &ChipProfile, host: &HostOptions, streams: usize) -> f64 {
        (self.requests * self.max_tokens) as f64 / self.wall_seconds(plan, chip, host, streams)
    }

    /// The prompt length at which the modelled aggregate equals `measured` at `streams`
    /// streams (to fit the unpublished prompt length on one measured row); `None` when decode
    /// alone is already slower than `measured`.
    pub fn fit_prompt_tokens(
        &self,
        plan: &Plan,
        chip: &ChipProfile,
        host: &HostOptions,
        streams: usize,
        measured: f64,
    ) -> Option<f64> {
        let decode_only = ServeLoad {
            prompt_tokens: 0.0,
            ..*self
        };
        let wall = (self.requests * self.max_tokens) as f64 / measured;
        let prefill = wall - decode_only.wall_seconds(plan, chip, host, streams);
        (prefill > 0.0).then(|| prefill * plan.prefill_tok_s(chip, host) / self.requests as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{PlanOptions, plan};
    use crate::plan_host::HostRuntime;

    #[test]
    fn prefill_lowers_the_aggregate_and_the_fit_inverts_it() {
        let dims = crate::plan::ModelDims::dense(2560, 9728, 32, 8, 128, 151_936, 36);
        let kinds = vec![crate::plan::LayerKind::Attention; dims.layers];
        let p = plan(&dims, &kinds, &PlanOptions::default()).expect("plan");
        let chip = ChipProfile::m3_max();
        let host = HostOptions {
            runtime: HostRuntime::AneCpp,
            ..HostOptions::default()
        };
        let none = ServeLoad::cpp_readme(0.0);
        let some = ServeLoad::cpp_readme(30.0);
        for c in [1, 2, 4] {
            let decode = p.decode_tok_s(&chip, &host, c);
            assert!((none.aggregate_tok_s(&p, &chip, &host, c) - decode).abs() < 1e-9 * decode);
            let with = some.aggregate_tok_s(&p, &chip, &host, c);
            assert!(with < decode);
            let fitted = some.fit_prompt_tokens(&p, &chip, &host, c, with).expect("fit");
            assert!((fitted - 30.0).abs() < 1e-6, "{fitted}");
        }
        assert_eq!(some.fit_prompt_tokens(&p, &chip, &host, 1, 1e9), None);
    }
}
