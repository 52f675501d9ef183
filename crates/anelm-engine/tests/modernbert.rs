//! A ModernBERT embedder against sentence-transformers: `fixtures/embeddings/modernbert/` is a
//! tiny random-weight model laid out as gte-modernbert / modernbert-embed are (a ModernBertModel
//! with global and local layers, mean pooling, Normalize, a `query` prompt), with its
//! `reference.json` (scripts/make-encoder-embedder-fixtures.py through scripts/make-embedding-fixtures.sh):
//! for texts of 3 to 73 tokens — longer than the local layers' 8 positions either side — the token
//! ids and the embeddings, with and without the query prompt. anelm must give the same ids and
//! cosine ≥ 0.9999 per text, in one batch and alone; it is refused as a language model.

use std::path::PathBuf;

use anelm_engine::{CpuBackend, Embedder, load_model_weights};
use serde_json::Value;

mod common;
use common::{check_embedder, check_gguf_embedder, embedding_cases};

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/embeddings/modernbert")
}

#[test]
fn modernbert_matches_sentence_transformers() {
    let text = std::fs::read_to_string(model_dir().join("reference.json")).expect("read reference.json");
    let fx: Value = serde_json::from_str(&text).expect("reference JSON");
    let mut emb = Embedder::load(&model_dir(), &CpuBackend::new()).expect("load the ModernBERT embedder");
    let info = emb.info().clone();
    assert_eq!(info.architecture, "modernbert");
    assert_eq!(info.dimensions, 64);
    assert_eq!(info.pooling, [anelm_engine::pooling::PoolingMode::Mean]);
    assert!(info.normalize);
    let prompt = fx["query_prompt"].as_str().expect("query_prompt");
    for (key, instruction) in [("texts", None), ("query_texts", Some(prompt.to_string()))] {
        emb.set_instruction(instruction.clone()).expect("set the instruction");
        let cases = embedding_cases(&fx[key]);
        assert!(
            cases.iter().any(|c| c.ids.len() > 2 * 9),
            "a text longer than the local window"
        );
        check_embedder(&emb, &cases, &format!("modernbert ({key})"));
    }
}

#[test]
fn modernbert_is_not_a_language_model() {
    let err = load_model_weights(&model_dir(), &CpuBackend::new(), &mut |_, _| {})
        .err()
        .expect("ModernBERT must not load as a language model")
        .to_string();
    assert!(err.contains("encoder") && err.contains("embedding model"), "{err}");
}

/// The fixture in llama.cpp's `modern-bert` GGUF layout (scripts/embedder-to-gguf.py: fused
/// `attn_qkv` and `ffn_up`, `token_embd_norm`, no `attn_norm` in layer 0, the window and the
/// global-layer period, two RoPE bases, mean pooling): the same embeddings for the reference's
/// token ids.
#[test]
fn modernbert_gguf_layout_matches_sentence_transformers() {
    let text = std::fs::read_to_string(model_dir().join("reference.json")).expect("read reference.json");
    let fx: Value = serde_json::from_str(&text).expect("reference JSON");
    check_gguf_embedder("modernbert.gguf", &embedding_cases(&fx["texts"]), "modern-bert", 64);
}
