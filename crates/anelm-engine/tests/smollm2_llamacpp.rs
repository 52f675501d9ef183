//! The real trained model against llama.cpp: SmolLM2-135M-Instruct Q4_1.
//!
//! What must hold, and why these tolerances:
//! - Tokenization of every fixture prompt equals llama.cpp's ids exactly.
//! - Teacher-forced on llama.cpp's own completion, our next-token distribution at every position
//!   agrees with llama.cpp's: the log-probability we give llama.cpp's top-1 token differs from
//!   llama.cpp's by at most `MAX_DLOGPROB` at any position and `MAX_MEAN_DLOGPROB` on average, and
//!   our argmax is llama.cpp's argmax wherever llama.cpp's top-2 margin exceeds `NOISE_MARGIN`
//!   (else it is one of llama.cpp's top two).
//! - Free-running greedy decoding (batched prefill, then one token per step through the KV cache)
//!   reproduces llama.cpp's tokens exactly up to the first position where our teacher-forced argmax
//!   differs from llama.cpp's, and that position is one where llama.cpp's own top-2 margin is
//!   below `NOISE_MARGIN`. So the decode path is checked token for token against the batched path,
//!   and every parting from llama.cpp is a near-tie.
//!
//! llama.cpp quantizes each activation row to 8-bit blocks before every quantized matmul, which
//! moves its logits away from exact arithmetic. Measured against an f64 exact-math forward of the
//! same weights (docs/field-guide.md): mean |Δ log p| 0.025–0.043 per case, at most 0.25; top-2
//! margins shifted by up to 0.61; and exact math's argmax differs from llama.cpp's at positions
//! where llama.cpp's margin is as large as 0.38. anelm also quantizes activations, but not in
//! llama.cpp's exact summation order, so ties that close may break either way. The bounds are set
//! from that measured noise, not fitted to pass: a wrong RoPE pairing, norm or quantization layout
//! moves log-probabilities by whole units.
//!
//! Needs the default model (`scripts/fetch-default-model.sh`; `scripts/test.sh` runs it first).

use anelm_engine::default_model::{FETCH_COMMAND, default_model_location};
use anelm_engine::{CpuBackend, LoadedModel, load_model};
use serde_json::Value;

mod common;
use common::{argmax, log_softmax_at, teacher_forced, top2};

/// llama.cpp top-2 margins below this are treated as ties its activation noise could flip
/// (exact arithmetic flips margins up to 0.38 and moves them by up to 0.61).
const NOISE_MARGIN: f64 = 0.5;
/// Largest allowed per-position |Δ log p(llama.cpp's top-1)|. Exact math: 0.25; anelm 0.2–0.32
/// depending only on f32 summation order in the matmul (scalar vs AVX2), at "def fibonacci(n):"
/// position 24, where llama.cpp's own margin is 0.38 and exact math picks another token.
const MAX_DLOGPROB: f64 = 0.5;
/// Largest allowed mean |Δ log p| over a case (exact math: up to 0.043).
const MAX_MEAN_DLOGPROB: f64 = 0.06;

fn fixture() -> Value {
    common::fixture("smollm2-llamacpp-greedy.json")
}

fn model() -> LoadedModel {
    let path = default_model_location().expect("a home directory");
    assert!(
        path.is_file(),
        "default model missing at {}: run {FETCH_COMMAND}",
        path.display()
    );
    load_model(&path, &CpuBackend::new(), &mut |_, _| {}).expect("load SmolLM2")
}

#[test]
fn tokenizes_like_llama_cpp() {
    common::check_tokenization(&model(), &fixture());
}

#[test]
fn teacher_forced_distribution_matches_llama_cpp() {
    let fx = fixture();
    let lm = model();
    for case in fx["cases"].as_array().expect("cases") {
        let prompt = case["prompt"].as_str().expect("prompt");
        let reference = top2(case);
        let ours_logits = teacher_forced(&lm, case);
        let mut total = 0.0;
        for (pos, (r, logits)) in reference.iter().zip(&ours_logits).enumerate() {
            let [(id0, lp0), (id1, lp1)] = *r;
            let d = (log_softmax_at(logits, id0) - lp0).abs();
            total += d;
            assert!(
                d <= MAX_DLOGPROB,
                "{prompt:?} position {pos}: log p({id0}) differs from llama.cpp by {d:.3}"
            );
            let ours = argmax(logits);
            if lp0 - lp1 > NOISE_MARGIN {
                assert_eq!(
                    ours,
                    id0,
                    "{prompt:?} position {pos}: argmax differs (llama.cpp margin {:.3})",
                    lp0 - lp1
                );
            } else {
                assert!(
                    ours == id0 || ours == id1,
                    "{prompt:?} position {pos}: argmax {ours} not in llama.cpp's top 2"
                );
            }
        }
        let mean = total / reference.len() as f64;
        println!("{prompt:?}: mean |dlogprob| {mean:.4}");
        assert!(mean <= MAX_MEAN_DLOGPROB, "{prompt:?}: mean |dlogprob| {mean:.3}");
    }
}

#[test]
fn greedy_generation_follows_llama_cpp_until_a_near_tie() {
    common::check_greedy_until_near_tie(&model(), &fixture(), NOISE_MARGIN);
}
