//! Many models in one server, end to end: `anelm serve --models-dir DIR` over a directory of
//! two chat models (the default model under two names), an embedding model, a cross-encoder
//! (the committed rerank fixture) and a truncated GGUF. Load on demand, concurrent requests to two models, a model that fails to load (a clear
//! error naming it; the others keep serving), LRU eviction under `--max-loaded-bytes`, the load
//! and unload endpoints, Ollama's `keep_alive`, per-model health and metrics, unknown models,
//! and the command line's errors.
//!
//! Needs the default model and all-MiniLM-L6-v2: `scripts/test.sh` fetches them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod serving;
use serving::{KEY, Server, start_with};

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("anelm-router-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cached(name: &str, script: &str) -> PathBuf {
    let p = anelm_engine::default_model::cache_dir()
        .expect("a home directory")
        .join("models")
        .join(name);
    assert!(
        p.exists(),
        "{} is missing: run {script} (scripts/test.sh does)",
        p.display()
    );
    p
}

fn smollm() -> PathBuf {
    cached("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/fetch-default-model.sh")
}

fn minilm() -> PathBuf {
    cached("all-MiniLM-L6-v2", "scripts/fetch-minilm.sh")
}

fn cross_encoder() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../anelm-engine/tests/fixtures/rerank/cross-encoder")
}

fn link(target: &Path, at: &Path) {
    std::os::unix::fs::symlink(target, at).expect("symlink");
}

/// A models directory: `chat-a.gguf` and `chat-b.gguf` (both SmolLM2), and with `extra` the
/// embedding model `minilm`, the reranker `cross-encoder` and `truncated.gguf` (SmolLM2's first
/// 4 KiB).
fn models_dir(tag: &str, extra: bool) -> TempDir {
    let dir = TempDir::new(tag);
    link(&smollm(), &dir.0.join("chat-a.gguf"));
    link(&smollm(), &dir.0.join("chat-b.gguf"));
    if extra {
        link(&minilm(), &dir.0.join("minilm"));
        link(&cross_encoder(), &dir.0.join("cross-encoder"));
        let head: Vec<u8> = std::fs::read(smollm()).expect("read the model")[..4096].to_vec();
        std::fs::write(dir.0.join("truncated.gguf"), head).expect("write");
    }
    dir
}

fn serve(dir: &TempDir, extra: &[&str]) -> Server {
    let d = dir.0.to_str().expect("utf-8 path");
    let mut args = vec!["--device", "cpu", "--models-dir", d];
    args.extend_from_slice(extra);
    start_with(2, 16, &args)
}

/// One request with the test key: (status, body as JSON, or the text as a JSON string).
fn call(port: u16, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let text = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let r = serving::http(port, method, path, text.as_bytes(), Some(KEY)).expect("request");
    let v = serde_json::from_str(&r.body).unwrap_or(Value::String(r.body));
    (r.status, v)
}

fn chat(port: u16, model: &str) -> (u16, Value) {
    call(
        port,
        "POST",
        "/v1/chat/completions",
        &json!({"model": model, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}),
    )
}

/// Every model's state in `/v1/models`, by id.
fn states(port: u16) -> Vec<(String, String)> {
    let (status, v) = call(port, "GET", "/v1/models", &Value::Null);
    assert_eq!(status, 200, "{v}");
    v["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap_or_default().to_string(),
                m["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn state_of(port: u16, id: &str) -> String {
    states(port)
        .into_iter()
        .find(|(i, _)| i == id)
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("no model {id} in /v1/models"))
}

fn metric(port: u16, line: &str) -> f64 {
    let r = serving::http(port, "GET", "/metrics", b"", Some(KEY)).expect("metrics");
    r.body
        .lines()
        .find_map(|l| l.strip_prefix(line)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line} missing:\n{}", r.body))
}

#[test]
fn models_load_on_demand_serve_side_by_side_and_survive_a_broken_one() {
    let dir = models_dir("many", true);
    let server = serve(&dir, &[]);
    let p = server.port;

    // Every model is listed, with its kind and size, and none is loaded before it is asked for.
    let (status, v) = call(p, "GET", "/v1/models", &Value::Null);
    assert_eq!(status, 200, "{v}");
    let data = v["data"].as_array().expect("data");
    let ids: Vec<&str> = data.iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids, ["chat-a", "chat-b", "cross-encoder", "minilm", "truncated"]);
    assert!(data.iter().all(|m| m["state"] == "unloaded"), "{v}");
    let kinds: Vec<&str> = data.iter().filter_map(|m| m["kind"].as_str()).collect();
    assert_eq!(kinds, ["chat", "chat", "rerank", "embedding", "chat"]);
    let smollm_bytes = std::fs::metadata(smollm()).expect("stat").len();
    assert_eq!(data[0]["size_bytes"].as_u64(), Some(smollm_bytes));
    assert_eq!(data[4]["size_bytes"].as_u64(), Some(4096));
    let (status, health) = call(p, "GET", "/health", &Value::Null);
    assert_eq!((status, health["models"][0]["state"].as_str()), (200, Some("unloaded")));

    // The first request loads its model, and only that one.
    let (status, v) = chat(p, "chat-a");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["model"], "chat-a");
    assert_eq!(state_of(p, "chat-a"), "loaded");
    assert_eq!(state_of(p, "chat-b"), "unloaded");
    assert_eq!(metric(p, "anelm_model_loads_total{model=\"chat-a\"}"), 1.0);

    // Concurrent requests to two models (one of them loading on its first request) and the
    // embedding model all succeed.
    let threads: Vec<_> = ["chat-a", "chat-b", "chat-a", "chat-b"]
        .into_iter()
        .map(|m| std::thread::spawn(move || chat(p, m)))
        .collect();
    let embed = std::thread::spawn(move || {
        call(
            p,
            "POST",
            "/v1/embeddings",
            &json!({"model": "minilm", "input": ["a cat", "a dog"]}),
        )
    });
    for (t, want) in threads.into_iter().zip(["chat-a", "chat-b", "chat-a", "chat-b"]) {
        let (status, v) = t.join().expect("thread");
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["model"], want);
        assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
    }
    let (status, v) = embed.join().expect("thread");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"][1]["embedding"].as_array().map(Vec::len), Some(384));
    // The reranker of the same process.
    let (status, v) = call(
        p,
        "POST",
        "/v1/rerank",
        &json!({"model": "cross-encoder", "query": "a cat", "documents": ["a dog", "a kitten", "a car"]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["model"], "cross-encoder");
    assert_eq!(v["results"].as_array().map(Vec::len), Some(3), "{v}");
    assert_eq!(metric(p, "anelm_model_loads_total{model=\"chat-b\"}"), 1.0);
    // An embedding model refuses chat as it does alone.
    let (status, v) = chat(p, "minilm");
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("does not generate text"),
        "{v}"
    );

    // The truncated file: a clear error naming it; /health stays 200 and reports it; the
    // others keep serving.
    let (status, v) = chat(p, "truncated");
    assert_eq!(status, 500, "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("'truncated' failed to load")
            && msg.contains("truncated.gguf")
            && msg.contains("truncated or corrupt"),
        "{msg}"
    );
    assert_eq!(state_of(p, "truncated"), "failed");
    let (status, health) = call(p, "GET", "/health", &Value::Null);
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["models"][4]["state"], "failed");
    let (status, one) = call(p, "GET", "/models/truncated/health", &Value::Null);
    assert_eq!((status, one["status"].as_str()), (503, Some("failed")), "{one}");
    assert!(
        one["error"]
            .as_str()
            .unwrap_or_default()
            .contains("truncated or corrupt"),
        "{one}"
    );
    // Asking again answers the same error at once, without a second load.
    let (status, _) = chat(p, "truncated");
    assert_eq!(status, 500);
    assert_eq!(metric(p, "anelm_model_load_failures_total{model=\"truncated\"}"), 1.0);
    for m in ["chat-a", "chat-b"] {
        let (status, v) = chat(p, m);
        assert_eq!(status, 200, "{m}: {v}");
    }
    let (status, one) = call(p, "GET", "/models/chat-a/health", &Value::Null);
    assert_eq!((status, one["status"].as_str()), (200, Some("ok")), "{one}");
    let r = serving::http(p, "GET", "/models/chat-a/metrics", b"", Some(KEY)).expect("metrics");
    assert!(r.body.contains("anelm_generated_tokens_total"), "{}", r.body);

    // A request without a model goes to the first (the default); names resolve case aside and
    // as Ollama writes them; an unknown one is a 404 that lists the models.
    let (status, v) = call(
        p,
        "POST",
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 3}),
    );
    assert_eq!(status, 200, "{v}");
    let (status, _) = chat(p, "CHAT-B:latest");
    assert_eq!(status, 200);
    let (status, v) = chat(p, "gpt-4o");
    assert_eq!(status, 404, "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("'gpt-4o'") && msg.contains("'chat-a', 'chat-b', 'cross-encoder', 'minilm' and 'truncated'"),
        "{msg}"
    );
    let (status, v) = call(
        p,
        "POST",
        "/api/chat",
        &json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(status, 404);
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains("'nope'")),
        "Ollama's error shape: {v}"
    );
    // A body over --max-body-bytes is refused before any model is chosen.
    let big = json!({"model": "chat-a", "prompt": "x".repeat(serving::BODY_LIMIT)});
    assert_eq!(call(p, "POST", "/v1/completions", &big).0, 413);

    // The unload endpoint: the model goes, and its next request loads it again.
    let (status, v) = call(p, "POST", "/v1/models/chat-a/unload", &Value::Null);
    assert_eq!((status, v["state"].as_str()), (200, Some("unloaded")), "{v}");
    assert_eq!(metric(p, "anelm_model_loaded{model=\"chat-a\"}"), 0.0);
    let (status, _) = chat(p, "chat-a");
    assert_eq!(status, 200);
    assert_eq!(metric(p, "anelm_model_loads_total{model=\"chat-a\"}"), 2.0);
    assert_eq!(metric(p, "anelm_model_unloads_total{model=\"chat-a\"}"), 1.0);
    // Unknown ids on the endpoints are 404s too.
    assert_eq!(call(p, "POST", "/v1/models/nope/load", &Value::Null).0, 404);

    // Ollama: /api/tags lists every model; keep_alive -1 pins, a duration unloads after that
    // idle time, and an empty request with keep_alive 0 unloads.
    let (status, v) = call(p, "GET", "/api/tags", &Value::Null);
    assert_eq!(status, 200);
    assert_eq!(v["models"].as_array().map(Vec::len), Some(5), "{v}");
    assert_eq!(v["models"][0]["name"], "chat-a:latest");
    // /api/ps: the loaded models only (the failed one is not).
    let (status, v) = call(p, "GET", "/api/ps", &Value::Null);
    assert_eq!(status, 200);
    let loaded: Vec<&str> = v["models"]
        .as_array()
        .expect("models")
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert_eq!(
        loaded,
        [
            "chat-a:latest",
            "chat-b:latest",
            "cross-encoder:latest",
            "minilm:latest"
        ],
        "{v}"
    );
    let generate = |keep: Value, prompt: &str| {
        call(
            p,
            "POST",
            "/api/generate",
            &json!({"model": "chat-b", "prompt": prompt, "stream": false, "keep_alive": keep,
                    "options": {"num_predict": 2}}),
        )
    };
    let (status, v) = generate(json!(-1), "Hi");
    assert_eq!(status, 200, "{v}");
    let (_, model) = call(p, "GET", "/v1/models/chat-b", &Value::Null);
    assert_eq!(model["pinned"], true, "{model}");
    let (status, v) = generate(json!("1s"), "Hi");
    assert_eq!(status, 200, "{v}");
    let t = Instant::now();
    while state_of(p, "chat-b") == "loaded" {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "keep_alive 1s did not unload chat-b"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(state_of(p, "chat-a"), "loaded", "only chat-b had a keep_alive");
    let (status, v) = call(p, "POST", "/api/generate", &json!({"model": "chat-a", "keep_alive": 0}));
    assert_eq!((status, v["done_reason"].as_str()), (200, Some("unload")), "{v}");
    assert_eq!(state_of(p, "chat-a"), "unloaded");
    let (status, v) = generate(json!("soon"), "Hi");
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].as_str().unwrap_or_default().contains("keep_alive"), "{v}");
}

#[test]
fn a_budget_unloads_the_least_recently_used_model() {
    let dir = models_dir("budget", false);
    let size = std::fs::metadata(smollm()).expect("stat").len();
    // Room for one of the two models, not both.
    let budget = (size + size / 2).to_string();
    let server = serve(&dir, &["--max-loaded-bytes", &budget]);
    let p = server.port;

    assert_eq!(chat(p, "chat-a").0, 200);
    assert_eq!(state_of(p, "chat-a"), "loaded");
    assert_eq!(metric(p, "anelm_loaded_bytes"), size as f64);
    // chat-b needs chat-a's room.
    assert_eq!(chat(p, "chat-b").0, 200);
    assert_eq!(
        states(p),
        [("chat-a".into(), "unloaded".into()), ("chat-b".into(), "loaded".into())]
    );
    assert_eq!(metric(p, "anelm_model_evictions_total{model=\"chat-a\"}"), 1.0);
    assert_eq!(metric(p, "anelm_loaded_bytes"), size as f64);
    assert_eq!(metric(p, "anelm_max_loaded_bytes"), (size + size / 2) as f64);
    // And back.
    assert_eq!(chat(p, "chat-a").0, 200);
    assert_eq!(state_of(p, "chat-b"), "unloaded");

    // Pinned with the load endpoint, chat-a stays: chat-b cannot be loaded, and says why.
    let (status, v) = call(p, "POST", "/v1/models/chat-a/load", &json!({"keep_alive": -1}));
    assert_eq!((status, v["pinned"].as_bool()), (200, Some(true)), "{v}");
    let (status, v) = chat(p, "chat-b");
    assert_eq!(status, 503, "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("'chat-b' cannot be loaded") && msg.contains("busy or pinned"),
        "{msg}"
    );
    assert_eq!(state_of(p, "chat-a"), "loaded");
    // Unloading forgets the pin; then chat-b loads.
    assert_eq!(call(p, "POST", "/v1/models/chat-a/unload", &Value::Null).0, 200);
    assert_eq!(chat(p, "chat-b").0, 200);
    let (status, v) = call(p, "POST", "/v1/models/chat-b/load", &json!({"keep_alive": -1, "x": 1}));
    assert_eq!(status, 400, "{v}");
}

/// `anelm serve ARGS`, which must fail before it listens: its stderr.
fn fails(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_anelm"))
        .arg("serve")
        .args(["--port", &serving::free_port().to_string(), "--no-data-dir"])
        .args(args)
        .output()
        .expect("run anelm");
    assert!(!out.status.success(), "anelm serve {args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_command_line_says_what_is_wrong() {
    let empty = TempDir::new("empty");
    let e = empty.0.to_str().expect("utf-8 path");
    assert!(fails(&["--models-dir", e]).contains("has no models"));
    let missing = empty.0.join("missing");
    let m = missing.to_str().expect("utf-8 path");
    assert!(fails(&["--models-dir", m]).contains("could not read --models-dir"));
    let model = smollm();
    let s = model.to_str().expect("utf-8 path");
    let err = fails(&["--model", s, "--model", s]);
    assert!(
        err.contains("two models are named 'SmolLM2-135M-Instruct.Q4_1'"),
        "{err}"
    );
    let err = fails(&["--model", s, "--model", m]);
    assert!(err.contains("--model") && err.contains("cannot read it"), "{err}");
    let err = fails(&["--model", s, "--max-loaded-bytes", "1000"]);
    assert!(err.contains("--max-loaded-bytes needs several models"), "{err}");
    let err = fails(&["--model", s, "--model", s, "--model-id", "x"]);
    assert!(err.contains("--model-id"), "{err}");
}
