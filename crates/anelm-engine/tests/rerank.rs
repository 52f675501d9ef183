//! Rerankers and classifiers against sentence-transformers and transformers, on the tiny random
//! fixtures of `fixtures/rerank/` (made by scripts/make-rerank-fixtures.sh):
//! - `cross-encoder/`: a one-label BertForSequenceClassification; for 21 (query, document)
//!   pairs (non-ASCII, three past the 96-token limit, truncated longest-first) the token and
//!   type ids CrossEncoder feeds it, the raw logit, and `CrossEncoder.predict`'s sigmoid score.
//! - `classifier/`: a 3-label head; transformers' softmax probabilities of single texts.
//! - `modernbert-cross-encoder/` and `modernbert-classifier/`: the same on a ModernBERT trunk
//!   (ModernBertForSequenceClassification: global and local layers, mean and `[CLS]` pooling,
//!   the prediction head).
//! - `decoder-reranker/`: a Qwen3ForCausalLM; P(yes) over the yes/no logits at the last position
//!   of Qwen3-Reranker's prompt, as its model card computes it.
//!
//! anelm must give the same ids and every score within 1e-4, scoring all pairs in one call
//! (packed forwards) and one by one, on the exact CPU backend, the embedding one (bf16 where
//! the CPU has it; then within 5e-3) and in 32-lane dispatches.

use std::path::PathBuf;

use anelm_engine::backend::Backend;
use anelm_engine::cross_encoder::ScoreActivation;
use anelm_engine::label_scores::label_probabilities;
use anelm_engine::{CpuBackend, CrossEncoder, DecoderReranker, RerankPrompt, Reranker};
use serde_json::Value;

mod common;
use common::NarrowCpu;

const TOLERANCE: f32 = 1e-4;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/rerank")
        .join(name)
}

fn reference(name: &str) -> Value {
    let text = std::fs::read_to_string(dir(name).join("reference.json")).expect("read reference.json");
    serde_json::from_str(&text).expect("reference JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn f(v: &Value) -> f32 {
    v.as_f64().expect("number") as f32
}

fn check_cross_encoder(fixture: &str, architecture: &str, backend: &dyn Backend, label: &str, tol: f32) {
    let label = &format!("{fixture}, {label}");
    let fx = reference(fixture);
    let ce = CrossEncoder::load(&dir(fixture), backend).expect("load the cross-encoder");
    let info = ce.info();
    assert_eq!(info.architecture, architecture);
    assert_eq!(info.labels, ["LABEL_0"]);
    assert_eq!(info.activation, ScoreActivation::Sigmoid);
    assert_eq!(info.max_tokens, fx["max_length"].as_u64().expect("max_length") as usize);
    let pairs = fx["pairs"].as_array().expect("pairs");
    assert!(pairs.len() >= 20);
    let mut worst = 0f32;
    for p in pairs {
        let (q, d) = (
            p["query"].as_str().expect("query"),
            p["document"].as_str().expect("doc"),
        );
        let enc = ce.tokenize_pairs(q, &[d]).expect("tokenize");
        assert_eq!(enc[0].ids, ids(&p["token_ids"]), "ids of {q:?} / {d:?}");
        if !p["type_ids"].is_null() {
            assert_eq!(enc[0].type_ids, ids(&p["type_ids"]), "type ids of {q:?} / {d:?}");
        }
        let alone = ce.rerank(q, &[d]).expect("rerank alone");
        let raw = ce.pair_logits(q, &[d]).expect("logits");
        let logit_diff = (raw[0].logits[0] - f(&p["logit"])).abs();
        // The score is a sigmoid (slope at most 1/4) of the logit.
        assert!(
            logit_diff < 4.0 * tol,
            "{label}: logit of {q:?} differs by {logit_diff}"
        );
        worst = worst.max((alone[0].logits[0] - f(&p["score"])).abs());
        assert_eq!(alone[0].tokens, enc[0].ids.len());
    }
    // Every pair of one query in one call (packed): the fixture's pairs grouped by query.
    let mut queries: Vec<&str> = pairs.iter().map(|p| p["query"].as_str().expect("query")).collect();
    queries.dedup();
    for q in queries {
        let group: Vec<&Value> = pairs.iter().filter(|p| p["query"] == q).collect();
        let docs: Vec<&str> = group.iter().map(|p| p["document"].as_str().expect("doc")).collect();
        let got = ce.rerank(q, &docs).expect("rerank");
        assert_eq!(got.len(), group.len(), "{label}: one score per document");
        for (g, p) in got.iter().zip(&group) {
            let diff = (g.logits[0] - f(&p["score"])).abs();
            assert!(diff < tol, "{label}: score of {q:?} in a batch differs by {diff}");
            worst = worst.max(diff);
        }
    }
    assert!(worst < tol, "{label}: worst score difference {worst}");
    eprintln!("cross-encoder ({label}): worst |score - CrossEncoder.predict| {worst:.2e}");
}

fn check_cross_encoder_on_every_backend(fixture: &str, architecture: &str) {
    check_cross_encoder(fixture, architecture, &CpuBackend::new(), "f32", TOLERANCE);
    check_cross_encoder(
        fixture,
        architecture,
        &NarrowCpu(CpuBackend::new()),
        "32 lanes",
        TOLERANCE,
    );
    let fast = CpuBackend::for_embeddings();
    let (label, tol) = if fast.bf16() {
        ("bf16", 5e-3)
    } else {
        ("f32", TOLERANCE)
    };
    check_cross_encoder(fixture, architecture, &fast, label, tol);
}

#[test]
fn cross_encoder_matches_sentence_transformers() {
    check_cross_encoder_on_every_backend("cross-encoder", "BertForSequenceClassification");
}

#[test]
fn modernbert_cross_encoder_matches_sentence_transformers() {
    check_cross_encoder_on_every_backend("modernbert-cross-encoder", "ModernBertForSequenceClassification");
}

#[test]
fn many_documents_pack_into_shared_forwards() {
    let fx = reference("cross-encoder");
    let ce = CrossEncoder::load(&dir("cross-encoder"), &NarrowCpu(CpuBackend::new())).expect("load");
    let p = &fx["pairs"][14];
    let (q, d) = (p["query"].as_str().expect("q"), p["document"].as_str().expect("d"));
    // 200 copies of a 96-token pair: several forwards of TOKENS_PER_FORWARD.
    let docs = vec![d; 200];
    let got = ce.rerank(q, &docs).expect("rerank");
    assert_eq!(got.len(), 200);
    for g in &got {
        assert!((g.logits[0] - f(&p["score"])).abs() < TOLERANCE);
    }
}

fn check_classifier(fixture: &str, backend: &dyn Backend) {
    let fx = reference(fixture);
    let ce = CrossEncoder::load(&dir(fixture), backend).expect("load the classifier");
    let labels: Vec<String> = fx["labels"]
        .as_array()
        .expect("labels")
        .iter()
        .map(|l| l.as_str().expect("label").to_string())
        .collect();
    assert_eq!(ce.info().labels, labels);
    assert_eq!(ce.info().activation, ScoreActivation::Identity);
    let texts: Vec<&str> = fx["texts"]
        .as_array()
        .expect("texts")
        .iter()
        .map(|t| t["text"].as_str().expect("text"))
        .collect();
    let got = ce.classify(&texts).expect("classify");
    assert_eq!(got.len(), texts.len(), "one result per text");
    for (g, t) in got.iter().zip(fx["texts"].as_array().expect("texts")) {
        assert_eq!(g.tokens, ids(&t["token_ids"]).len(), "tokens of {:?}", t["text"]);
        for (a, b) in g
            .logits
            .iter()
            .zip(t["probabilities"].as_array().expect("probabilities"))
        {
            assert!((a - f(b)).abs() < TOLERANCE, "{fixture}: {:?}: {a} vs {b}", t["text"]);
        }
    }
    let err = ce
        .rerank("q", &["d"])
        .expect_err("three labels have no relevance score");
    assert!(err.to_string().contains("classify"), "{err}");
}

#[test]
fn sequence_classifier_matches_transformers() {
    check_classifier("classifier", &CpuBackend::new());
}

#[test]
fn modernbert_sequence_classifier_matches_transformers() {
    check_classifier("modernbert-classifier", &CpuBackend::new());
    check_classifier("modernbert-classifier", &NarrowCpu(CpuBackend::new()));
}

/// A ModernBERT classifier's config that names a pooling transformers does not define, or a head
/// bias its checkpoint lacks, is refused naming it.
#[test]
fn a_modernbert_classifier_with_a_broken_head_is_refused() {
    let tmp = std::env::temp_dir().join(format!("anelm-modernbert-head-{}", std::process::id()));
    let copy = |to: &std::path::Path| {
        for entry in std::fs::read_dir(dir("modernbert-classifier")).expect("read the fixture") {
            let entry = entry.expect("entry");
            std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
        }
    };
    let bad_pooling = tmp.join("pooling");
    std::fs::create_dir_all(&bad_pooling).expect("mkdir");
    copy(&bad_pooling);
    let cfg_path = bad_pooling.join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).expect("read")).expect("json");
    cfg["classifier_pooling"] = Value::from("max");
    std::fs::write(&cfg_path, cfg.to_string()).expect("write");
    let err = CrossEncoder::load(&bad_pooling, &CpuBackend::new()).expect_err("max pooling is not ModernBERT's");
    assert!(err.to_string().contains("classifier_pooling 'max'"), "{err}");

    cfg["classifier_pooling"] = Value::from("cls");
    cfg["classifier_bias"] = Value::from(true);
    std::fs::write(&cfg_path, cfg.to_string()).expect("write");
    let err = CrossEncoder::load(&bad_pooling, &CpuBackend::new()).expect_err("a bias the checkpoint lacks");
    assert!(err.to_string().contains("head.dense.bias"), "{err}");
    std::fs::remove_dir_all(&tmp).ok();
}

fn check_decoder(backend: &dyn Backend, label: &str) {
    let fx = reference("decoder-reranker");
    let prompt = RerankPrompt::default();
    assert_eq!(fx["instruction"].as_str(), Some(prompt.instruction.as_str()));
    let r = DecoderReranker::load(&dir("decoder-reranker"), backend, prompt, &mut |_, _| {}).expect("load");
    let pairs = fx["pairs"].as_array().expect("pairs");
    let mut worst = 0f32;
    for p in pairs {
        let (q, d) = (p["query"].as_str().expect("q"), p["document"].as_str().expect("d"));
        let got = r.tokenize(q, &[d]).expect("tokenize");
        assert_eq!(got[0], ids(&p["token_ids"]), "prompt ids of {q:?} / {d:?}");
    }
    let q = pairs[0]["query"].as_str().expect("q");
    // One call per query with all its documents (one batched pass), and every pair alone.
    for p in pairs {
        let (pq, d) = (p["query"].as_str().expect("q"), p["document"].as_str().expect("d"));
        let alone = r.rerank(pq, &[d]).expect("rerank");
        worst = worst.max((alone[0].logits[0] - f(&p["p_yes"])).abs());
    }
    let group: Vec<&Value> = pairs.iter().filter(|p| p["query"] == q).collect();
    let docs: Vec<&str> = group.iter().map(|p| p["document"].as_str().expect("d")).collect();
    let scored = r.rerank(q, &docs).expect("rerank");
    assert_eq!(scored.len(), group.len(), "{label}: one score per document");
    for (g, p) in scored.iter().zip(&group) {
        worst = worst.max((g.logits[0] - f(&p["p_yes"])).abs());
    }
    assert!(worst < TOLERANCE, "{label}: worst P(yes) difference {worst}");
    eprintln!("decoder reranker ({label}): worst |P(yes) - transformers| {worst:.2e}");
}

#[test]
fn decoder_reranker_matches_transformers() {
    check_decoder(&CpuBackend::new(), "f32");
    check_decoder(&NarrowCpu(CpuBackend::new()), "32 lanes");
}

#[test]
fn all_pairs_of_the_decoder_fixture_in_one_call() {
    // Different queries need different calls; the same query with many documents, some long,
    // goes through one batched pass that crosses forwards (STEP_TOKENS).
    let fx = reference("decoder-reranker");
    let r = DecoderReranker::load(
        &dir("decoder-reranker"),
        &CpuBackend::new(),
        RerankPrompt::default(),
        &mut |_, _| {},
    )
    .expect("load");
    let long = fx["pairs"]
        .as_array()
        .expect("pairs")
        .last()
        .expect("a long pair")
        .clone();
    let (q, d) = (
        long["query"].as_str().expect("q"),
        long["document"].as_str().expect("d"),
    );
    let docs = vec![d; 5];
    for g in r.rerank(q, &docs).expect("rerank") {
        assert!((g.logits[0] - f(&long["p_yes"])).abs() < TOLERANCE);
    }
}

#[test]
fn label_probabilities_are_the_yes_no_softmax() {
    // The classification call over the labels ["no", "yes"] after the reranker's prompt is the
    // reranker's score: P(yes) = its probability among the two labels.
    let fx = reference("decoder-reranker");
    let r = DecoderReranker::load(
        &dir("decoder-reranker"),
        &CpuBackend::new(),
        RerankPrompt::default(),
        &mut |_, _| {},
    )
    .expect("load");
    let pairs = fx["pairs"].as_array().expect("pairs");
    let prompts: Vec<Vec<u32>> = pairs.iter().map(|p| ids(&p["token_ids"])).collect();
    let labels = vec!["no".to_string(), "yes".to_string()];
    let got = label_probabilities(r.model(), &prompts, &labels).expect("classify");
    for (g, p) in got.iter().zip(pairs) {
        assert!((g.probabilities[1] - f(&p["p_yes"])).abs() < TOLERANCE);
        assert!((g.probabilities.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        assert!(g.logprobs.iter().all(|&l| l <= 0.0));
    }
    let same = vec!["yes".to_string(), "yes please".to_string()];
    let err = label_probabilities(r.model(), &prompts, &same).expect_err("same first token");
    assert!(err.to_string().contains("same token"), "{err}");
}

#[test]
fn reranker_picks_the_kind_from_the_config() {
    let ce = Reranker::load(
        &dir("cross-encoder"),
        &CpuBackend::new(),
        RerankPrompt::default(),
        &mut |_, _| {},
    )
    .expect("cross-encoder");
    assert_eq!(ce.kind(), "cross-encoder");
    assert_eq!(ce.max_tokens(), 96);
    let dec = Reranker::load(
        &dir("decoder-reranker"),
        &CpuBackend::new(),
        RerankPrompt::default(),
        &mut |_, _| {},
    )
    .expect("decoder");
    assert_eq!(dec.kind(), "decoder");
    let bad = RerankPrompt {
        yes: "definitely yes".into(),
        ..RerankPrompt::default()
    };
    let err = DecoderReranker::load(&dir("decoder-reranker"), &CpuBackend::new(), bad, &mut |_, _| {})
        .expect_err("two tokens");
    assert!(err.to_string().contains("not one"), "{err}");
}
