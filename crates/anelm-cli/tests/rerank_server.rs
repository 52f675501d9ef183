//! `/v1/rerank` and `/v1/classify` end to end over HTTP: `anelm serve --model CROSS_ENCODER`
//! (rerank only; chat and embeddings answer 400) with scores checked against
//! sentence-transformers' fixture, the llama.cpp aliases, `top_n`, `return_documents` and
//! OpenAI error bodies for bad input; a 3-label classifier's head through `/v1/classify`; and
//! `--rerank-model` (a Qwen3 yes/no reranker) beside the default chat model, with P(yes)
//! checked against transformers and `/v1/classify` on the chat model.
//!
//! The fixtures are committed (scripts/make-rerank-fixtures.sh); the chat model is the default
//! one scripts/test.sh fetches.

use std::path::PathBuf;

use serde_json::{Value, json};

mod serving;
use serving::{KEY, Server, start_with};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../anelm-engine/tests/fixtures/rerank")
        .join(name)
}

fn reference(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name).join("reference.json")).expect("reference.json");
    serde_json::from_str(&text).expect("JSON")
}

fn start(args: &[&str]) -> Server {
    let mut all = vec!["--device", "cpu"];
    all.extend_from_slice(args);
    start_with(2, 16, &all)
}

fn post(port: u16, path: &str, body: &Value) -> (u16, Value) {
    let r = serving::http(port, "POST", path, body.to_string().as_bytes(), Some(KEY)).expect("request");
    let v = serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.body));
    (r.status, v)
}

/// POST expecting a 400 with an OpenAI error body; returns its message.
fn error_of(port: u16, path: &str, body: &Value) -> String {
    let (status, v) = post(port, path, body);
    assert_eq!(status, 400, "{body}: {v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    v["error"]["message"].as_str().expect("message").to_string()
}

fn path_str(p: &std::path::Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn a_cross_encoder_server_reranks_as_sentence_transformers_scores() {
    let dir = fixture("cross-encoder");
    let server = start(&["--model", path_str(&dir)]);
    let p = server.port;
    let fx = reference("cross-encoder");
    let pairs = fx["pairs"].as_array().expect("pairs");
    // The pairs of the first query: one request, every document scored, sorted best first.
    let q = pairs[0]["query"].as_str().expect("query");
    let group: Vec<&Value> = pairs.iter().filter(|x| x["query"] == q).collect();
    let docs: Vec<Value> = group
        .iter()
        .enumerate()
        .map(|(i, x)| {
            // Both document forms: a string and {"text"}.
            if i % 2 == 0 {
                x["document"].clone()
            } else {
                json!({"text": x["document"]})
            }
        })
        .collect();
    for path in ["/v1/rerank", "/rerank", "/v1/reranking"] {
        let (status, v) = post(
            p,
            path,
            &json!({"model": "cross-encoder", "query": q, "documents": docs, "return_documents": true}),
        );
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["object"], "list");
        assert_eq!(v["model"], "cross-encoder");
        let results = v["results"].as_array().expect("results");
        assert_eq!(results.len(), group.len());
        let mut last = f64::INFINITY;
        for r in results {
            let i = r["index"].as_u64().expect("index") as usize;
            let score = r["relevance_score"].as_f64().expect("score");
            let want = group[i]["score"].as_f64().expect("score");
            assert!((score - want).abs() < 1e-4, "{path}: document {i}: {score} vs {want}");
            assert!(score <= last, "results are sorted best first");
            last = score;
            assert_eq!(r["document"]["text"], group[i]["document"]);
        }
        let tokens: u64 = group
            .iter()
            .map(|x| x["token_ids"].as_array().map_or(0, |a| a.len() as u64))
            .sum();
        assert_eq!(v["usage"]["total_tokens"], tokens);
    }
    // A long pair is truncated to the model's 96 tokens, as sentence-transformers truncates it.
    let long = &pairs[16];
    let (status, v) = post(
        p,
        "/v1/rerank",
        &json!({"query": long["query"], "documents": [long["document"], "x"], "top_n": 1}),
    );
    assert_eq!(status, 200, "{v}");
    let results = v["results"].as_array().expect("results");
    assert_eq!(results.len(), 1, "top_n cuts the list");
    assert!(results[0].get("document").is_none(), "documents only when asked for");

    // Bad input: 400s that say what is wrong.
    let e = |body: Value| error_of(p, "/v1/rerank", &body);
    assert!(e(json!({"query": "q", "documents": []})).contains("empty list"));
    assert!(e(json!({"documents": ["a"]})).contains("'query' is required"));
    assert!(e(json!({"query": "q", "documents": ["a", ""]})).contains("item 1 is an empty string"));
    assert!(e(json!({"query": "q", "documents": vec!["a"; 1001]})).contains("at most 1000"));
    assert!(e(json!({"query": "q", "documents": ["a"], "top_n": 0})).contains("positive"));
    assert!(e(json!({"query": "q", "documents": ["a"], "max_tokens_per_doc": 5})).contains("not supported"));

    // A rerank-only server: no chat, no embeddings; /v1/models lists the reranker.
    let chat = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert!(error_of(p, "/v1/chat/completions", &chat).contains("is a reranker"));
    assert!(error_of(p, "/v1/embeddings", &json!({"input": "hi"})).contains("is a reranker"));
    let r = serving::http(p, "GET", "/v1/models", b"", Some(KEY)).expect("models");
    let v: Value = serde_json::from_str(&r.body).expect("JSON");
    assert_eq!(v["data"][0]["id"], "cross-encoder");
    assert_eq!(v["data"].as_array().map(Vec::len), Some(1));
}

#[test]
fn classify_reads_a_sequence_classifiers_head() {
    let dir = fixture("classifier");
    let server = start(&["--model", path_str(&dir)]);
    let fx = reference("classifier");
    let texts: Vec<&Value> = fx["texts"].as_array().expect("texts").iter().collect();
    let inputs: Vec<&Value> = texts.iter().map(|t| &t["text"]).collect();
    let (status, v) = post(server.port, "/v1/classify", &json!({"input": inputs}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"].as_array().expect("data").len(), texts.len(), "{v}");
    for (d, t) in v["data"].as_array().expect("data").iter().zip(&texts) {
        let labels = d["labels"].as_array().expect("labels");
        assert_eq!(labels.len(), 3);
        for (l, (name, want)) in labels.iter().zip(
            fx["labels"]
                .as_array()
                .expect("names")
                .iter()
                .zip(t["probabilities"].as_array().expect("p")),
        ) {
            assert_eq!(&l["label"], name);
            let got = l["probability"].as_f64().expect("probability");
            assert!(
                (got - want.as_f64().expect("p")).abs() < 1e-4,
                "{}: {got} vs {want}",
                t["text"]
            );
        }
        // The reported label is the head's most probable one in the reference.
        let probs = t["probabilities"].as_array().expect("p");
        let best = (0..probs.len())
            .max_by(|&a, &b| {
                probs[a]
                    .as_f64()
                    .unwrap_or(0.0)
                    .total_cmp(&probs[b].as_f64().unwrap_or(0.0))
            })
            .expect("labels");
        assert_eq!(d["label"], fx["labels"][best], "the head's most probable label");
    }
    // Some of the head's labels, in the asked order; an unknown one is refused.
    let (status, v) = post(
        server.port,
        "/v1/classify",
        &json!({"input": "x", "labels": ["positive", "negative"]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"][0]["labels"][0]["label"], "positive");
    let msg = error_of(server.port, "/v1/classify", &json!({"input": "x", "labels": ["spam"]}));
    assert!(msg.contains("does not have"), "{msg}");
    // Three labels have no single relevance score.
    let msg = error_of(server.port, "/v1/rerank", &json!({"query": "q", "documents": ["d"]}));
    assert!(msg.contains("classify"), "{msg}");
}

#[test]
fn a_decoder_reranker_beside_the_chat_model() {
    let dir = fixture("decoder-reranker");
    let server = start(&["--rerank-model", path_str(&dir)]);
    let p = server.port;
    let fx = reference("decoder-reranker");
    let pairs = fx["pairs"].as_array().expect("pairs");
    let q = pairs[0]["query"].as_str().expect("query");
    let group: Vec<&Value> = pairs.iter().filter(|x| x["query"] == q).collect();
    let docs: Vec<&Value> = group.iter().map(|x| &x["document"]).collect();
    let (status, v) = post(
        p,
        "/v1/rerank",
        &json!({"model": "decoder-reranker", "query": q, "documents": docs}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["results"].as_array().expect("results").len(), group.len(), "{v}");
    for r in v["results"].as_array().expect("results") {
        let i = r["index"].as_u64().expect("index") as usize;
        let got = r["relevance_score"].as_f64().expect("score");
        let want = group[i]["p_yes"].as_f64().expect("p_yes");
        assert!((got - want).abs() < 1e-4, "document {i}: {got} vs {want}");
    }
    // The reranker's own labels through /v1/classify: the raw prompt, labels no/yes.
    let prompt = anelm_engine::RerankPrompt::default().render(q, group[0]["document"].as_str().expect("doc"));
    let (status, v) = post(
        p,
        "/v1/classify",
        &json!({"model": "decoder-reranker", "input": prompt, "labels": ["no", "yes"], "raw": true}),
    );
    assert_eq!(status, 200, "{v}");
    let yes = v["data"][0]["labels"][1]["probability"].as_f64().expect("p");
    assert!((yes - group[0]["p_yes"].as_f64().expect("p_yes")).abs() < 1e-4);

    // The chat model classifies too (chat-templated prompt): probabilities over the labels.
    let (status, v) = post(
        p,
        "/v1/classify",
        &json!({"input": ["Is the sky blue? Answer yes or no.", "Is fire cold? Answer yes or no."],
                "labels": ["yes", "no"]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"].as_array().expect("data").len(), 2, "{v}");
    for d in v["data"].as_array().expect("data") {
        let labels = d["labels"].as_array().expect("labels");
        assert_eq!(labels.len(), 2, "{d}");
        let ps: Vec<f64> = labels.iter().map(|l| l["probability"].as_f64().expect("p")).collect();
        let lps: Vec<f64> = labels.iter().map(|l| l["logprob"].as_f64().expect("logprob")).collect();
        // The probabilities are the softmax of the labels' log-probabilities over the vocabulary.
        let z: f64 = lps.iter().map(|l| l.exp()).sum();
        for (p, lp) in ps.iter().zip(&lps) {
            assert!((p - lp.exp() / z).abs() < 1e-4, "{d}");
            assert!(*lp <= 0.0, "{d}");
        }
    }
    let msg = error_of(p, "/v1/classify", &json!({"input": "x"}));
    assert!(msg.contains("'labels' is required"), "{msg}");
    let r = serving::http(p, "GET", "/v1/models", b"", Some(KEY)).expect("models");
    let v: Value = serde_json::from_str(&r.body).expect("JSON");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert!(ids.contains(&"decoder-reranker"), "{ids:?}");
    assert_eq!(ids.len(), 2, "{ids:?}");
}
