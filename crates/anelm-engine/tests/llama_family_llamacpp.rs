//! The tiny random-weight Qwen2, Qwen3-MoE, LFM2 and Phi-3 fixtures in llama.cpp's GGUF layouts
//! (`qwen2`, `qwen3moe`, `lfm2`, `phi3`, written by `scripts/llama-family-to-gguf.py`) against
//! llama.cpp itself (`fixtures/llamacpp/{qwen2,qwen3moe,lfm2,phi3}-fixture-llamacpp-greedy.json`, made by
//! `scripts/make-llamacpp-fixtures.sh`): the biases, the routing and experts, and the short
//! convolutions as llama.cpp computes them, not only as transformers does (`hf_transformers.rs`).
//!
//! The weights are F32 and both sides round K/V to f16 (llama.cpp's cache); the rest of
//! llama.cpp's attention (its f16 paths inside the kernels) and summation order differ from
//! anelm's f32, so the log-probabilities of llama.cpp's top two agree within `MAX_DLOGPROB` —
//! measured 5.7e-3 (Qwen2), 2.6e-3 (Qwen3-MoE), 4.0e-3 (LFM2) and 2.8e-3 (Phi-3), against 3.9 average |log p| and a 0.5 bound
//! for the real SmolLM2 — and the greedy tokens too except at a near-tie. A wrong bias, RoPE
//! pairing, router or expert slice moves them by tenths.

use std::path::PathBuf;

use anelm_engine::{CpuBackend, LoadedModel, load_model};

mod common;

const MAX_DLOGPROB: f64 = 1e-2;
const NOISE_MARGIN: f64 = 1e-2;

fn model(file: &str) -> LoadedModel {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(file);
    load_model(&path, &CpuBackend::new(), &mut |_, _| {}).unwrap_or_else(|e| panic!("load {file}: {e}"))
}

fn check(file: &str, fixture: &str) {
    let fx = common::fixture(fixture);
    let lm = model(file);
    common::check_tokenization(&lm, &fx);
    common::check_llamacpp_log_probs(&lm, &fx, file, MAX_DLOGPROB, NOISE_MARGIN);
    common::check_greedy_until_near_tie(&lm, &fx, NOISE_MARGIN);
}

#[test]
fn qwen2_gguf_matches_llama_cpp() {
    check("qwen2.gguf", "qwen2-fixture-llamacpp-greedy.json");
}

#[test]
fn qwen3_moe_gguf_matches_llama_cpp() {
    check("qwen3_moe.gguf", "qwen3moe-fixture-llamacpp-greedy.json");
}

/// Phi-3's fused projections, partial rotary and long-RoPE short factors with their attention
/// factor as llama.cpp computes them (the prompts stay inside the sliding window, which
/// llama.cpp's Phi-3 does not apply).
#[test]
fn phi3_gguf_matches_llama_cpp() {
    check("phi3.gguf", "phi3-fixture-llamacpp-greedy.json");
}

#[test]
fn lfm2_gguf_matches_llama_cpp() {
    check("lfm2.gguf", "lfm2-fixture-llamacpp-greedy.json");
}
