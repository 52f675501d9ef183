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
    common::check_llamacpp_log_probs(&lm, &fx, "qwen3_5_text.gguf", MAX_DLOGPROB, NOISE_MARGIN);
    common::check_greedy_until_near_tie(&lm, &fx, NOISE_MARGIN);
}
