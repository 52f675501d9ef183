//! The tiny random-weight Qwen3.5 fixture in llama.cpp's GGUF layout against llama.cpp itself
//! (`fixtures/llamacpp/qwen35-fixture-llamacpp-greedy.json`, made by
//! `scripts/make-llamacpp-fixtures.sh`): the hybrid model's DeltaNet and gated attention as
//! llama.cpp computes them, not only as transformers does (`hf_transformers.rs`).
//!
//! The weights are F32 and llama.cpp quantizes nothing here, so the two should agree to float
//! rounding: every log-probability of llama.cpp's top two within `MAX_DLOGPROB`, the greedy
//! tokens identical except at a near-tie. Measured: at most a few 1e-4 apart.

use std::path::PathBuf;

use anelm_engine::{CpuBackend, LoadedModel, load_model};

mod common;
use common::{argmax, log_softmax_at, teacher_forced, top2};

const MAX_DLOGPROB: f64 = 2e-3;
const NOISE_MARGIN: f64 = 1e-2;

fn model() -> LoadedModel {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/qwen3_5_text.gguf");
    load_model(&path, &CpuBackend::new(), &mut |_, _| {}).expect("the Qwen3.5 GGUF fixture loads with its tokenizer")
}

#[test]
fn tokenizes_like_llama_cpp() {
    common::check_tokenization(&model(), &common::fixture("qwen35-fixture-llamacpp-greedy.json"));
}

#[test]
fn log_probabilities_and_greedy_tokens_match_llama_cpp() {
    let fx = common::fixture("qwen35-fixture-llamacpp-greedy.json");
    let lm = model();
    let mut worst = 0f64;
    for case in fx["cases"].as_array().expect("cases") {
        for (pos, (r, logits)) in top2(case).iter().zip(teacher_forced(&lm, case)).enumerate() {
            for &(id, lp) in r {
                let d = (log_softmax_at(&logits, id) - lp).abs();
                worst = worst.max(d);
                assert!(
                    d <= MAX_DLOGPROB,
                    "position {pos}: log p({id}) differs from llama.cpp by {d:.2e}"
                );
            }
            let [(id0, a), (_, b)] = *r;
            if a - b > NOISE_MARGIN {
                assert_eq!(
                    argmax(&logits),
                    id0,
                    "position {pos}: argmax differs where llama.cpp's margin is {:.3}",
                    a - b
                );
            }
        }
    }
    println!("largest |Δ log p| against llama.cpp: {worst:.2e}");
    common::check_greedy_until_near_tie(&lm, &fx, NOISE_MARGIN);
}
