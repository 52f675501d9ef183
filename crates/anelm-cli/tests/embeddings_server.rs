//! `/v1/embeddings` end to end: the official openai client against `anelm serve --model CHAT
//! --embedding-model MINILM` (a string, a list, token arrays, `dimensions`, base64, chat and
//! embeddings under concurrent load; vectors checked against sentence-transformers' fixture),
//! OpenAI error bodies for bad input, and an embedding-only server refusing chat.
//!
//! Needs the default model, all-MiniLM-L6-v2 and the Python virtualenv: `scripts/test.sh`
//! fetches and sets them up.

use std::path::PathBuf;

use serde_json::{Value, json};

mod serving;
use serving::{KEY, Server, run_client_script, start_with};

fn minilm() -> PathBuf {
    let dir = anelm_engine::default_model::cache_dir()
        .expect("a home directory")
        .join("models/all-MiniLM-L6-v2");
    assert!(
        dir.join("modules.json").is_file(),
        "{} is missing: run scripts/fetch-minilm.sh (scripts/test.sh does)",
        dir.display()
    );
    dir
}

fn start(args: &[&str]) -> Server {
    let mut all = vec!["--device", "cpu", "--max-body-bytes", "8388608"];
    all.extend_from_slice(args);
    start_with(2, 64, &all)
}

/// One request with the test key: (status, body).
fn http(port: u16, method: &str, path: &str, body: &str) -> Result<(u16, String), String> {
    serving::http(port, method, path, body.as_bytes(), Some(KEY))
        .map(|r| (r.status, r.body))
        .map_err(|e| e.to_string())
}

/// POST to `path`, expecting a 4xx OpenAI error body; returns its message.
fn error_of(port: u16, path: &str, body: &Value) -> String {
    let (status, text) = http(port, "POST", path, &body.to_string()).expect("request");
    assert!((400..500).contains(&status), "status {status} for {body}: {text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    let err = &v["error"];
    assert_eq!(err["type"], "invalid_request_error", "{text}");
    assert!(err.get("param").is_some() && err.get("code").is_some(), "{text}");
    err["message"].as_str().expect("message").to_string()
}

#[test]
fn openai_client_gets_embeddings_beside_chat() {
    let dir = minilm();
    let server = start(&["--embedding-model", dir.to_str().expect("utf-8 path")]);
    let fixture =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../anelm-engine/tests/fixtures/embeddings/minilm.json");
    run_client_script(
        "openai_embeddings.py",
        server.port,
        &[fixture.to_str().expect("utf-8 path")],
    );

    // Bad input: each a 400 with an OpenAI error body that says what is wrong.
    let p = server.port;
    let m = "all-MiniLM-L6-v2";
    let e = |body: Value| error_of(p, "/v1/embeddings", &body);
    assert!(e(json!({"model": m, "input": []})).contains("empty list"));
    assert!(e(json!({"model": m, "input": ["a", 7]})).contains("item 1 is not a string"));
    assert!(e(json!({"model": m, "input": vec!["a"; 2049]})).contains("at most 2048"));
    // 300 token arrays of 256 tokens: 76,800 tokens, past the 65,536-token limit.
    let long: Vec<Vec<u32>> = vec![vec![2773; 256]; 300];
    assert!(e(json!({"model": m, "input": long})).contains("at most 65536"));
    assert!(e(json!({"model": m, "input": [vec![2773; 257]]})).contains("at most 256 per input"));
    assert!(e(json!({"model": m, "input": "x", "dimensions": 0})).contains("dimensions"));
}

#[test]
fn an_embedding_only_server_refuses_chat() {
    let dir = minilm();
    let server = start(&["--model", dir.to_str().expect("utf-8 path")]);
    let p = server.port;
    let chat = json!({"model": "all-MiniLM-L6-v2", "messages": [{"role": "user", "content": "hi"}]});
    assert!(error_of(p, "/v1/chat/completions", &chat).contains("this model does not generate text"));
    let completion = json!({"model": "all-MiniLM-L6-v2", "prompt": "hi"});
    assert!(error_of(p, "/v1/completions", &completion).contains("this model does not generate text"));
    let (status, body) = http(p, "GET", "/v1/models", "").expect("models");
    assert_eq!(status, 200);
    let ids: Vec<String> = serde_json::from_str::<Value>(&body).expect("JSON")["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| m["id"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(ids, ["all-MiniLM-L6-v2"]);
    let (status, body) = http(
        p,
        "POST",
        "/v1/embeddings",
        &json!({"model": "all-MiniLM-L6-v2", "input": ["a cat", "a dog"]}).to_string(),
    )
    .expect("embeddings");
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["data"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["data"][1]["embedding"].as_array().map(Vec::len), Some(384));
    assert_eq!(v["usage"]["prompt_tokens"], 8);
}
