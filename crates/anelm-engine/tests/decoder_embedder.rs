//! A decoder embedder (Qwen3 trunk, last-token pooling, Normalize, a `query` prompt) against
//! sentence-transformers: `fixtures/embeddings/qwen3-embedder/` is a tiny random-weight model
//! with its `reference.json` (made by scripts/make-embedding-fixtures.sh through
//! scripts/make-decoder-embedder-fixture.py): for texts of lengths 2 to 64 tokens embedded in
//! one padded batch (the script checks left and right padding agree), the token ids and the
//! embeddings, with and without the query prompt. anelm must give the same ids and cosine ≥
//! 0.9999 per text, embedding the whole batch in one call (packed, no padding) and each text
//! alone, on the exact CPU backend, the embedding one (bf16 where the CPU has it) and in
//! 32-token forwards (the Neural Engine's dispatch, so long inputs continue across forwards).

use std::path::PathBuf;
use std::sync::Arc;

use anelm_engine::backend::Backend;
use anelm_engine::{CpuBackend, Embedder, EngineError};
use anelm_model::tensor_store::TensorStore;
use serde_json::Value;

mod common;
use common::{NarrowCpu, check_embedder, cosine, embedding_cases};

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/embeddings/qwen3-embedder")
}

fn reference() -> Value {
    let text = std::fs::read_to_string(model_dir().join("reference.json")).expect("read reference.json");
    serde_json::from_str(&text).expect("reference JSON")
}

fn check(backend: &dyn Backend, label: &str) {
    let fx = reference();
    let mut emb = Embedder::load(&model_dir(), backend).expect("load the decoder embedder");
    let info = emb.info().clone();
    assert_eq!(info.architecture, "qwen3");
    assert_eq!(info.dimensions, 64);
    assert_eq!(info.pooling, [anelm_engine::pooling::PoolingMode::LastToken]);
    assert!(info.normalize);
    assert_eq!(emb.instruction(), None, "the fixture names no default prompt");
    let prompt = fx["query_prompt"].as_str().expect("query_prompt");
    assert_eq!(emb.prompt("query"), Some(prompt));

    for (key, instruction) in [("texts", None), ("query_texts", Some(prompt.to_string()))] {
        emb.set_instruction(instruction.clone()).expect("set the instruction");
        let cases = embedding_cases(&fx[key]);
        let lens: Vec<usize> = cases.iter().map(|c| c.ids.len()).collect();
        let (min, max) = (lens.iter().min().copied(), lens.iter().max().copied());
        assert!(
            matches!((min, max), (Some(a), Some(b)) if b >= 2 * a && b == 64),
            "the batch should mix short texts and texts truncated at 64 tokens: {lens:?}"
        );
        check_embedder(&emb, &cases, &format!("qwen3 embedder ({label}, {key})"));
    }
}

#[test]
fn qwen3_embedder_matches_sentence_transformers() {
    check(&CpuBackend::new(), "f32");
}

#[test]
fn qwen3_embedder_on_the_embedding_backend_matches_sentence_transformers() {
    let b = CpuBackend::for_embeddings();
    check(&b, if b.bf16() { "bf16" } else { "f32" });
}

#[test]
fn qwen3_embedder_in_32_token_forwards_matches_sentence_transformers() {
    check(&NarrowCpu(CpuBackend::new()), "32-lane");
}

#[test]
fn qwen3_embedder_rejects_bad_token_inputs() {
    let emb = Embedder::load(&model_dir(), &CpuBackend::new()).expect("load");
    let max = emb.info().max_tokens;
    assert_eq!(max, 64, "max_tokens from tokenizer_config.json's model_max_length");
    let bad = |seqs: Vec<Vec<u32>>| match emb.embed_tokens(&seqs) {
        Err(EngineError::InvalidRequest(m)) => m,
        other => panic!("expected an invalid-request error, got {other:?}"),
    };
    assert!(bad(vec![vec![1, 2], vec![]]).contains("input 1 has no tokens"));
    assert!(bad(vec![vec![1; max + 1]]).contains("at most 64"));
    assert!(bad(vec![vec![1, 9999]]).contains("vocabulary"));
}

/// Pooling over every token of a causal trunk, checked by causality: token k's final state is
/// the last-token state of the input's first k + 1 tokens. So the first-token (`Cls`) part
/// equals the last-token embedding of the one-token prefix, and the mean part the average of
/// every prefix's last-token embedding, also when the input spans several 32-token forwards.
#[test]
fn decoder_mean_and_first_token_pooling_follow_from_causality() {
    use anelm_engine::decoder_embedder::DecoderTrunk;
    use anelm_engine::pooling::PoolingMode::{Cls, LastToken, Mean};
    use anelm_model::hf_config::HfConfig;
    use anelm_model::safetensors_dir::SafetensorsDir;
    let dir = model_dir();
    let hf = HfConfig::from_file(&dir.join("config.json")).expect("config.json");
    let store: Arc<dyn TensorStore> = Arc::new(SafetensorsDir::open(&dir).expect("open"));
    let trunk = DecoderTrunk::load(&hf, store, &NarrowCpu(CpuBackend::new()), &mut |_, _| {}).expect("load trunk");
    let fx = reference();
    let long = embedding_cases(&fx["texts"])
        .into_iter()
        .map(|c| c.ids)
        .max_by_key(Vec::len)
        .expect("a text");
    assert!(long.len() > 32, "the input should span two forwards");
    let short = vec![long[0], long[1], long[2]];
    let got = trunk.embed(&[&short, &long], &[Cls, Mean, LastToken]).expect("embed");
    let h = trunk.hidden_size();
    let prefixes: Vec<&[u32]> = (1..=long.len()).map(|k| &long[..k]).collect();
    let lasts = trunk.embed(&prefixes, &[LastToken]).expect("prefixes");
    let close = |a: &[f32], b: &[f32], what: &str| {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{what}[{i}]: {x} vs {y}");
        }
    };
    let v = &got[1];
    assert_eq!(v.len(), 3 * h);
    close(&v[..h], &lasts[0], "first token");
    let mut mean = vec![0f32; h];
    for l in &lasts {
        for (m, x) in mean.iter_mut().zip(l) {
            *m += x / lasts.len() as f32;
        }
    }
    close(&v[h..2 * h], &mean, "mean");
    close(&v[2 * h..], &lasts[lasts.len() - 1], "last token");
    // The short input beside it: its own prefixes.
    close(&got[0][..h], &lasts[0], "short first token");
    close(&got[0][2 * h..], &lasts[2], "short last token");
}

/// A pooling config that leaves the prompt's tokens out (`include_prompt: false`) with mean
/// pooling: anelm pools every token, so an instruction is refused rather than giving other
/// vectors than sentence-transformers; without one the model embeds.
#[test]
fn an_instruction_is_refused_when_pooling_leaves_the_prompt_out() {
    let src = model_dir();
    let dir = std::env::temp_dir().join(format!("anelm-embedder-include-prompt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["", "1_Pooling", "2_Normalize"] {
        std::fs::create_dir_all(dir.join(sub)).expect("mkdir");
        for e in std::fs::read_dir(src.join(sub)).expect("read fixture dir") {
            let e = e.expect("entry");
            if e.path().is_file() {
                std::fs::copy(e.path(), dir.join(sub).join(e.file_name())).expect("copy");
            }
        }
    }
    std::fs::write(
        dir.join("1_Pooling/config.json"),
        r#"{"embedding_dimension": 64, "pooling_mode": "mean", "include_prompt": false}"#,
    )
    .expect("write pooling config");
    let mut emb = Embedder::load(&dir, &CpuBackend::new()).expect("load");
    assert!(emb.embed(&["hello"]).is_ok());
    match emb.set_instruction(Some("Query: ".into())) {
        Err(EngineError::Config(m)) => assert!(m.contains("include_prompt"), "{m}"),
        other => panic!("expected a config error, got {other:?}"),
    }
    assert_eq!(emb.instruction(), None);
    emb.set_instruction(None).expect("no instruction is fine");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same embedder as a GGUF (`fixtures/embeddings/qwen3-embedder.gguf`, written from the
/// directory by scripts/make-decoder-embedder-gguf.py in llama.cpp's `qwen3` layout with
/// `qwen3.pooling_type` = 3, last token; llama.cpp's own server reproduces the reference from
/// it, see docs/field-guide.md): its pooling comes from the metadata, its tokenizer from the
/// GGUF, and its vectors equal sentence-transformers' for every text, with and without the
/// query prompt.
#[test]
fn qwen3_embedder_gguf_takes_its_pooling_from_the_metadata() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/embeddings/qwen3-embedder.gguf");
    assert!(Embedder::is_embedding_model(&path));
    for backend in [&CpuBackend::new() as &dyn Backend, &NarrowCpu(CpuBackend::new())] {
        let mut emb = Embedder::load(&path, backend).expect("load the GGUF embedder");
        let info = emb.info().clone();
        assert_eq!(info.architecture, "qwen3");
        assert_eq!(info.dimensions, 64);
        assert_eq!(info.pooling, [anelm_engine::pooling::PoolingMode::LastToken]);
        assert!(info.normalize);
        assert_eq!(info.max_tokens, 512, "a GGUF embeds up to its training context");
        let fx = reference();
        let prompt = fx["query_prompt"].as_str().expect("query_prompt").to_string();
        for (key, instruction) in [("texts", None), ("query_texts", Some(prompt))] {
            emb.set_instruction(instruction).expect("set the instruction");
            let cases = embedding_cases(&fx[key]);
            // sentence-transformers truncated at 64 tokens; the GGUF does not, so texts are
            // compared by their tokens where they were truncated.
            let untruncated: Vec<_> = cases.iter().filter(|c| c.ids.len() < 64).collect();
            assert!(untruncated.len() >= 5, "{key}: {} short texts", untruncated.len());
            let texts: Vec<&str> = untruncated.iter().map(|c| c.text.as_str()).collect();
            let ids = emb.tokenize(&texts).expect("tokenize");
            let by_text = emb.embed(&texts).expect("embed texts");
            for ((c, got), v) in untruncated.iter().zip(&ids).zip(&by_text) {
                assert_eq!(got, &c.ids, "{key}: token ids of {:?}", c.text);
                let cos = cosine(v, &c.embedding);
                assert!(cos >= 0.9999, "{key}: cosine {cos:.7} for {:?}", c.text);
            }
            let seqs: Vec<Vec<u32>> = cases.iter().map(|c| c.ids.clone()).collect();
            for (c, v) in cases.iter().zip(emb.embed_tokens(&seqs).expect("embed tokens")) {
                let cos = cosine(&v, &c.embedding);
                assert!(cos >= 0.9999, "{key}: cosine {cos:.7} for the tokens of {:?}", c.text);
            }
        }
    }
}

/// A chat model's GGUF (no `pooling_type`) is not an embedding model: `is_embedding_model`
/// says so and loading it as one fails with a message naming the missing key.
#[test]
fn a_chat_gguf_is_not_an_embedding_model() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/qwen3_5.gguf");
    assert!(!Embedder::is_embedding_model(&path));
    match Embedder::load(&path, &CpuBackend::new()) {
        Err(EngineError::Config(m)) => assert!(m.contains("qwen35.pooling_type"), "{m}"),
        other => panic!("expected a config error, got {:?}", other.map(|e| e.info().clone())),
    }
}
