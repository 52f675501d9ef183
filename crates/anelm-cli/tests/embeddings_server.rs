//! `/v1/embeddings` end to end: the official openai client against `anelm serve --model CHAT
//! --embedding-model MINILM` (a string, a list, token arrays, `dimensions`, base64, chat and
//! embeddings under concurrent load; vectors checked against sentence-transformers' fixture),
//! OpenAI error bodies for bad input, and an embedding-only server refusing chat.
//!
//! Needs the default model, all-MiniLM-L6-v2 and the Python virtualenv: `scripts/test.sh`
//! fetches and sets them up.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const KEY: &str = "emb-key";

/// A running server, killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let child = Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args([
            "serve",
            "--port",
            &port.to_string(),
            "--api-key",
            KEY,
            "-t",
            "2",
            "--device",
            "cpu",
        ])
        .args(["--sessions", "2", "--ctx-size", "1024"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start anelm serve");
    let server = Server { child, port };
    let t = Instant::now();
    while http(port, "GET", "/health", "").map(|r| r.0) != Ok(200) {
        assert!(t.elapsed() < Duration::from_secs(120), "server not healthy after 120 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    server
}

/// One request with `Connection: close`: (status, body).
fn http(port: u16, method: &str, path: &str, body: &str) -> Result<(u16, String), String> {
    let go = || -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(120)))?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes())?;
        s.write_all(body.as_bytes())?;
        let mut raw = String::new();
        s.read_to_string(&mut raw)?;
        let (headers, payload) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = headers
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok((status, payload.to_string()))
    };
    go().map_err(|e| e.to_string())
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

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("ANELM_TEST_PYTHON") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let p = home.join(".cache/anelm/venv-openai/bin/python");
    assert!(
        p.exists(),
        "no Python with the openai client: run scripts/setup-test-env.sh (scripts/test.sh does)"
    );
    p
}

#[test]
fn openai_client_gets_embeddings_beside_chat() {
    let dir = minilm();
    let server = start(&["--embedding-model", dir.to_str().expect("utf-8 path")]);
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let fixture = manifest.join("../anelm-engine/tests/fixtures/embeddings/minilm.json");
    let out = Command::new(python())
        .arg(manifest.join("tests/openai_embeddings.py"))
        .arg(format!("http://127.0.0.1:{}/v1", server.port))
        .arg(KEY)
        .arg(&fixture)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "openai embeddings checks failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());

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
