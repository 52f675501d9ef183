//! EmbeddingGemma against sentence-transformers: `fixtures/embeddings/embeddinggemma/` is a tiny
//! random-weight model laid out as google/embeddinggemma-300m is (a Gemma 3 text model with
//! bidirectional attention, mean pooling, Dense 64 → 128 → 64 without bias, Normalize, `query` and
//! `document` prompts), with its `reference.json` (scripts/make-encoder-embedder-fixtures.py through
//! scripts/make-embedding-fixtures.sh): for texts of different lengths, the token ids and the
//! embeddings, with and without the query prompt. anelm must give the same ids and cosine ≥
//! 0.9999 per text, in one batch and alone; the same model as a language model is refused, an
//! input longer than one forward runs whole in one (its attention looks ahead, so it is never
//! split), and llama.cpp's `gemma-embedding` GGUF layout of the same model gives the same embeddings.

use std::path::PathBuf;

use anelm_engine::{CpuBackend, Embedder, load_model_weights};
use serde_json::Value;

mod common;
use common::{NarrowCpu, check_embedder, check_gguf_embedder, cosine, embedding_cases};

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/embeddings/embeddinggemma")
}

fn reference() -> Value {
    let text = std::fs::read_to_string(model_dir().join("reference.json")).expect("read reference.json");
    serde_json::from_str(&text).expect("reference JSON")
}

#[test]
fn embeddinggemma_matches_sentence_transformers() {
    let fx = reference();
    let mut emb = Embedder::load(&model_dir(), &CpuBackend::new()).expect("load EmbeddingGemma");
    let info = emb.info().clone();
    assert_eq!(info.architecture, "gemma3_text");
    assert_eq!(info.dimensions, 64, "the last Dense module's width");
    assert_eq!(info.pooling, [anelm_engine::pooling::PoolingMode::Mean]);
    assert!(info.normalize);
    let prompt = fx["query_prompt"].as_str().expect("query_prompt");
    assert_eq!(emb.prompt("query"), Some(prompt));
    for (key, instruction) in [("texts", None), ("query_texts", Some(prompt.to_string()))] {
        emb.set_instruction(instruction.clone()).expect("set the instruction");
        let cases = embedding_cases(&fx[key]);
        check_embedder(&emb, &cases, &format!("embeddinggemma ({key})"));
    }
}

#[test]
fn a_bidirectional_model_is_not_a_language_model() {
    let err = load_model_weights(&model_dir(), &CpuBackend::new(), &mut |_, _| {})
        .err()
        .expect("EmbeddingGemma must not load as a language model")
        .to_string();
    assert!(
        err.contains("bidirectional") && err.contains("embedding model"),
        "{err}"
    );
}

#[test]
fn an_input_longer_than_one_forward_runs_whole_not_split() {
    // 32-lane dispatches: the input is longer than a forward's budget, so it runs alone in one
    // forward whose kernels split their dispatches (its attention looks ahead, so the input
    // itself is never split): the same embedding as on the CPU's 512-lane dispatches.
    let narrow = Embedder::load(&model_dir(), &NarrowCpu(CpuBackend::new())).expect("load");
    let wide = Embedder::load(&model_dir(), &CpuBackend::new()).expect("load");
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(8);
    let texts = ["Hello!", long.as_str(), "A short one after it."];
    assert!(narrow.tokenize(&[long.as_str()]).expect("tokenize")[0].len() > 32);
    let got = narrow.embed(&texts).expect("a long bidirectional input runs whole");
    let want = wide.embed(&texts).expect("embed");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let cos = cosine(g, w);
        assert!(
            cos > 0.999_999,
            "text {i}: cosine {cos} between 32-lane and 512-lane dispatches"
        );
    }
}

/// The fixture in llama.cpp's `gemma-embedding` GGUF layout (scripts/embedder-to-gguf.py:
/// norms stored as `1 + w`, the symmetric window, per-layer sliding flags, mean pooling, the Dense
/// modules as `dense_2` / `dense_3`): the same embeddings for the reference's token ids, within
/// the f16 rounding of K/V and GELU that a GGUF's llama.cpp numerics bring.
#[test]
fn embeddinggemma_gguf_layout_matches_sentence_transformers() {
    check_gguf_embedder(
        "embeddinggemma.gguf",
        &embedding_cases(&reference()["texts"]),
        "gemma-embedding",
        64,
    );
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/embeddinggemma.gguf");
    let err = load_model_weights(&path, &CpuBackend::new(), &mut |_, _| {})
        .err()
        .expect("not a language model")
        .to_string();
    assert!(err.contains("bidirectional"), "{err}");
}
