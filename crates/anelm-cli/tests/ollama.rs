//! Ollama's native API end to end: the official `ollama` Python client against `anelm serve
//! --embedding-model MINILM` (chat and generate, streamed and whole, `format`, options, tools,
//! `embed`, the model routes, refusals: `tests/ollama_client.py`), Ollama's error bodies, and
//! `keep_alive` releasing and keeping the model on a server with `--idle-unload`.
//!
//! Needs the default model, all-MiniLM-L6-v2 and the Python virtualenv with the `ollama`
//! client: `scripts/test.sh` fetches and sets them up.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod serving;
use serving::{KEY, http, metric, run_client_script, start_with};

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

/// POST `body` to `path` with the key: (status, JSON body).
fn post(port: u16, path: &str, body: &Value) -> (u16, Value) {
    let r = http(port, "POST", path, body.to_string().as_bytes(), Some(KEY)).expect("request");
    let v = serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.body));
    (r.status, v)
}

fn get(port: u16, path: &str) -> Value {
    let r = http(port, "GET", path, b"", Some(KEY)).expect("request");
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).expect("JSON")
}

/// Wait until the metric `name` reaches `want`.
fn wait_for(port: u16, name: &str, want: f64) {
    let t = Instant::now();
    while metric(port, name) < want {
        assert!(t.elapsed() < Duration::from_secs(20), "{name} never reached {want}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_official_ollama_client_works_against_the_server() {
    let dir = minilm();
    let server = start_with(
        2,
        64,
        &[
            "--device",
            "cpu",
            "--embedding-model",
            dir.to_str().expect("utf-8 path"),
        ],
    );
    run_client_script("ollama_client.py", server.port, &[]);

    // Errors are Ollama's `{"error": "..."}` alone, with the status.
    let p = server.port;
    for (path, body, status, words) in [
        (
            "/api/chat",
            json!({"model": "nope", "messages": []}),
            404,
            "model 'nope' not found",
        ),
        ("/api/chat", json!({"messages": []}), 400, "model is required"),
        (
            "/api/generate",
            json!({"model": "smollm2", "prompt": "x", "options": {"tfs_z": 2}}),
            400,
            "tfs_z",
        ),
        (
            "/api/embed",
            json!({"model": "all-minilm-l6-v2", "input": [1, 2]}),
            400,
            "input[0]",
        ),
    ] {
        let (got, v) = post(p, path, &body);
        assert_eq!(got, status, "{body}: {v}");
        let obj = v.as_object().expect("an object");
        assert_eq!(obj.len(), 1, "{v}");
        assert!(v["error"].as_str().is_some_and(|e| e.contains(words)), "{v}");
    }
    let r = http(p, "POST", "/api/chat", b"{not json", Some(KEY)).expect("request");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body.starts_with("{\"error\":\"the body is not valid JSON"),
        "{}",
        r.body
    );
    assert_eq!(metric(p, "busy_sessions"), 0.0);
}

/// The year of an RFC 3339 time.
fn year(t: &Value) -> i32 {
    t.as_str()
        .and_then(|s| s.get(..4))
        .and_then(|y| y.parse().ok())
        .unwrap_or_else(|| panic!("not a time: {t}"))
}

#[test]
fn keep_alive_releases_and_keeps_the_model_with_idle_unload() {
    let server = start_with(1, 8, &["--device", "cpu", "--idle-unload", "600"]);
    let p = server.port;
    let ask = |keep: Value| {
        json!({"model": "smollm2", "prompt": "Hi", "stream": false, "keep_alive": keep,
               "options": {"num_predict": 4, "temperature": 0}})
    };
    // Answered, then released at once.
    let (status, v) = post(p, "/api/generate", &ask(json!(0)));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["done"], true);
    wait_for(p, "sleeps_total", 1.0);
    assert_eq!(get(p, "/api/ps")["models"], json!([]));

    // The next request reloads it; -1 keeps it loaded for good.
    let (status, v) = post(p, "/api/generate", &ask(json!(-1)));
    assert_eq!(status, 200, "{v}");
    assert!(v["load_duration"].as_u64().is_some_and(|d| d > 0), "{v}");
    let ps = get(p, "/api/ps");
    assert!(year(&ps["models"][0]["expires_at"]) > 2100, "{ps}");
    // "5m": it expires within five minutes.
    let (status, v) = post(p, "/api/generate", &ask(json!("5m")));
    assert_eq!(status, 200, "{v}");
    let ps = get(p, "/api/ps");
    assert!(year(&ps["models"][0]["expires_at"]) < 2100, "{ps}");

    // An unload request (no prompt, keep_alive 0) releases it.
    let (status, v) = post(p, "/api/generate", &json!({"model": "smollm2", "keep_alive": 0}));
    assert_eq!((status, v["done_reason"].as_str()), (200, Some("unload")), "{v}");
    wait_for(p, "sleeps_total", 2.0);
    // A load request loads it again.
    let (status, v) = post(p, "/api/chat", &json!({"model": "smollm2", "messages": []}));
    assert_eq!((status, v["done_reason"].as_str()), (200, Some("load")), "{v}");
    assert_eq!(get(p, "/api/ps")["models"].as_array().map(Vec::len), Some(1));
}
