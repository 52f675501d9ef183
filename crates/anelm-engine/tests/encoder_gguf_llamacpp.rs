//! The bidirectional encoders in llama.cpp's GGUF layouts against llama.cpp itself: the tiny
//! random-weight EmbeddingGemma and ModernBERT fixtures converted by `scripts/embedder-to-gguf.py`
//! (`fixtures/gguf/{embeddinggemma,modernbert}.gguf`) and the pooled vectors llama.cpp computes for
//! three prompts, one longer than the local layers' reach
//! (`fixtures/llamacpp/{embeddinggemma,modernbert}-fixture-llamacpp-embed.json`, made by
//! `scripts/make-llamacpp-fixtures.sh` with the greedy tool's `embed` mode). anelm embeds
//! llama.cpp's token ids and must point the same way: cosine ≥ 0.9999, measured 1 − 7.9e-8
//! (EmbeddingGemma) and 1 − 1.2e-7 (ModernBERT, whose GELU llama.cpp approximates with tanh where
//! transformers, which anelm follows, is exact); a wrong window, pooling, Dense module or tensor
//! moves the cosine far below.
//! The same GGUFs against sentence-transformers are in `embeddinggemma.rs` and `modernbert.rs`.

use std::path::PathBuf;

use anelm_engine::{CpuBackend, Embedder};
use serde_json::Value;

mod common;
use common::cosine;

const MIN_COSINE: f64 = 0.9999;

fn check(gguf: &str, fixture: &str, architecture: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(gguf);
    let emb = Embedder::load(&path, &CpuBackend::new()).unwrap_or_else(|e| panic!("load {gguf}: {e}"));
    assert_eq!(emb.info().architecture, architecture);
    let fx = common::fixture(fixture);
    let cases = fx["cases"].as_array().expect("cases");
    assert!(cases.len() >= 3, "{fixture}: three prompts");
    let ids: Vec<Vec<u32>> = cases
        .iter()
        .map(|c| {
            c["prompt_ids"]
                .as_array()
                .expect("prompt_ids")
                .iter()
                .map(|v| v.as_u64().expect("id") as u32)
                .collect()
        })
        .collect();
    assert!(
        ids.iter().any(|s| s.len() > 100),
        "{fixture}: a prompt past the local window"
    );
    let got = emb.embed_tokens(&ids).expect("embed llama.cpp's ids");
    let mut worst = 1f64;
    for (i, (g, c)) in got.iter().zip(cases).enumerate() {
        let want: Vec<f32> = c["embedding"]
            .as_array()
            .expect("embedding")
            .iter()
            .map(|v: &Value| v.as_f64().expect("value") as f32)
            .collect();
        assert_eq!(g.len(), want.len(), "{gguf}: embedding width");
        let cos = cosine(g, &want);
        assert!(
            cos >= MIN_COSINE,
            "{gguf} prompt {i}: cosine {cos:.7} against llama.cpp"
        );
        worst = worst.min(cos);
    }
    println!("{gguf}: lowest cosine against llama.cpp 1 - {:.2e}", 1.0 - worst);
}

#[test]
fn embeddinggemma_gguf_matches_llama_cpp() {
    check(
        "embeddinggemma.gguf",
        "embeddinggemma-fixture-llamacpp-embed.json",
        "gemma-embedding",
    );
}

#[test]
fn modernbert_gguf_matches_llama_cpp() {
    check(
        "modernbert.gguf",
        "modernbert-fixture-llamacpp-embed.json",
        "modern-bert",
    );
}
