//! The Files and Batch APIs end to end: the official openai client round trip
//! (`tests/batches_client.py`), a batch that survives SIGKILLs at seeded random instants and
//! SIGTERMs with exactly one output line per input line, and an interactive request that gets
//! a session while a batch fills them all.
//!
//! Needs the default model, all-MiniLM-L6-v2 and the Python virtualenv (`scripts/test.sh`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod serving;
use serving::*;

fn minilm() -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let dir = std::env::var_os("ANELM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".cache/anelm"))
        .join("models/all-MiniLM-L6-v2");
    assert!(
        dir.join("config.json").is_file(),
        "all-MiniLM-L6-v2 missing at {}: run scripts/fetch-minilm.sh",
        dir.display()
    );
    dir
}

fn json_of(r: &Reply) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.body))
}

/// Upload `lines` as a batch file and start a chat batch over it; returns the batch id.
fn submit(port: u16, lines: &[Value]) -> String {
    let mut content = String::new();
    for l in lines {
        content.push_str(&l.to_string());
        content.push('\n');
    }
    let boundary = "anelm-test-boundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n{content}\r\n--{boundary}--\r\n"
    );
    let r = http_with(
        port,
        "POST",
        "/v1/files",
        body.as_bytes(),
        Some(KEY),
        &[("Content-Type", &format!("multipart/form-data; boundary={boundary}"))],
    )
    .expect("upload");
    assert_eq!(r.status, 200, "{}", r.body);
    let file_id = json_of(&r)["id"].as_str().expect("file id").to_string();
    let req = json!({"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"});
    let r = http(port, "POST", "/v1/batches", req.to_string().as_bytes(), Some(KEY)).expect("create");
    assert_eq!(r.status, 200, "{}", r.body);
    json_of(&r)["id"].as_str().expect("batch id").to_string()
}

fn batch(port: u16, id: &str) -> Value {
    let r = http(port, "GET", &format!("/v1/batches/{id}"), b"", Some(KEY)).expect("get batch");
    assert_eq!(r.status, 200, "{}", r.body);
    json_of(&r)
}

fn wait_final(port: u16, id: &str, limit: Duration) -> Value {
    let t = Instant::now();
    loop {
        let b = batch(port, id);
        if ["completed", "failed", "expired", "cancelled"].contains(&b["status"].as_str().unwrap_or("")) {
            return b;
        }
        assert!(t.elapsed() < limit, "batch still {} after {limit:?}", b["status"]);
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn file_lines(port: u16, id: &Value) -> Vec<Value> {
    let Some(id) = id.as_str() else {
        return Vec::new();
    };
    let r = http(port, "GET", &format!("/v1/files/{id}/content"), b"", Some(KEY)).expect("content");
    assert_eq!(r.status, 200, "{}", r.body);
    r.body
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

fn line(i: usize, max_tokens: usize) -> Value {
    json!({"custom_id": format!("req-{i}"), "method": "POST", "url": "/v1/chat/completions",
           "body": {"messages": [{"role": "user", "content": format!("Write a sentence about the number {i}.")}],
                    "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true}})
}

/// A tiny deterministic RNG (the kill instants).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn send_signal(server: &Server, signal: i32) {
    // SAFETY: kill(2) on the pid of a child this test started and has not yet reaped.
    let rc = unsafe { libc::kill(server.child.id() as i32, signal) };
    assert_eq!(rc, 0, "could not signal the server");
}

#[test]
fn the_official_openai_client_runs_files_and_batches() {
    let dir = TempDir::new("batches-client");
    let emb = minilm();
    let server = start_with(
        4,
        64,
        &[
            "--data-dir",
            dir.arg(),
            "--max-file-bytes",
            "200000",
            "--embedding-model",
            emb.to_str().expect("utf-8 path"),
        ],
    );
    run_client_script("batches_client.py", server.port, &["all-MiniLM-L6-v2"]);
    assert_eq!(metric(server.port, "busy_sessions"), 0.0);
}

/// SIGKILL at seeded random instants, then SIGTERM, each followed by a restart on the same
/// data directory: the batch resumes by itself, and every input line ends with exactly one
/// output line whose answer is the one the request gets interactively.
#[test]
fn a_batch_survives_kills_and_restarts_with_exactly_one_output_per_line() {
    const LINES: usize = 32;
    let dir = TempDir::new("batches-kill");
    let port = free_port();
    let args = ["--data-dir", dir.arg(), "--shutdown-grace", "2"];
    let mut server = start_on(port, 4, 64, &args, &[]);
    let lines: Vec<Value> = (0..LINES).map(|i| line(i, 96)).collect();
    let id = submit(port, &lines);
    let mut rng = Rng(0x5eed_0035);
    let mut seen_progress = Vec::new();
    for round in 0..4u64 {
        // The stop instant follows the batch's own progress, not the wall clock, so a fast host
        // cannot finish the batch before the stops: wait until a seeded number of lines (spread
        // over the batch: round r waits for r/4 of it plus up to 1/8 more) has completed, then
        // a seeded 0-300 ms more, so the signal lands at an arbitrary point of the lines in flight.
        let target = round * LINES as u64 / 4 + rng.below(LINES as u64 / 8);
        let t = Instant::now();
        while batch(port, &id)["request_counts"]["completed"].as_u64().unwrap_or(0) < target {
            assert!(
                t.elapsed() < Duration::from_secs(180),
                "the batch did not reach {target} completed lines in 180 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(rng.below(300)));
        let b = batch(port, &id);
        seen_progress.push(b["request_counts"]["completed"].as_u64().unwrap_or(0));
        if b["status"] == "completed" {
            break;
        }
        if round == 3 {
            // A graceful stop: lines in flight finish (or stay pending) within the grace period.
            send_signal(&server, libc::SIGTERM);
            let t = Instant::now();
            while server.child.try_wait().expect("wait").is_none() {
                assert!(
                    t.elapsed() < Duration::from_secs(30),
                    "SIGTERM did not stop the server in 30 s"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        } else {
            send_signal(&server, libc::SIGKILL);
            let _ = server.child.wait();
        }
        drop(server);
        server = start_on(port, 4, 64, &args, &[]);
    }
    let b = wait_final(port, &id, Duration::from_secs(300));
    assert_eq!(b["status"], "completed", "{b}");
    assert_eq!(b["request_counts"]["completed"], LINES as u64, "{b}");
    let out = file_lines(port, &b["output_file_id"]);
    assert!(file_lines(port, &b["error_file_id"]).is_empty());
    let mut count: HashMap<String, usize> = HashMap::new();
    for l in &out {
        *count
            .entry(l["custom_id"].as_str().expect("custom_id").to_string())
            .or_default() += 1;
    }
    assert_eq!(count.len(), LINES, "lines missing: {count:?}");
    assert!(count.values().all(|&n| n == 1), "lines duplicated: {count:?}");
    // Every answer is the one the request gets when sent interactively (greedy).
    for l in &out {
        let i: usize = l["custom_id"]
            .as_str()
            .and_then(|s| s.strip_prefix("req-"))
            .and_then(|s| s.parse().ok())
            .expect("index");
        let r = http(
            port,
            "POST",
            "/v1/chat/completions",
            lines[i]["body"].to_string().as_bytes(),
            Some(KEY),
        )
        .expect("direct");
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            l["response"]["body"]["choices"][0]["message"]["content"],
            json_of(&r)["choices"][0]["message"]["content"],
            "line {i} differs from the interactive answer"
        );
    }
    eprintln!("completed lines seen before each stop: {seen_progress:?}");
    let mid_batch = seen_progress.iter().filter(|&&n| n < LINES as u64).count();
    assert!(
        mid_batch >= 2,
        "only {mid_batch} stops came before the batch ended ({seen_progress:?}): the test needs longer lines"
    );
}

/// While a batch holds every session with long lines, an interactive request takes one at the
/// next step and finishes before any batch line does; the batch then completes in full.
#[test]
fn an_interactive_request_goes_first_during_a_full_batch() {
    let dir = TempDir::new("batches-priority");
    let server = start_with(2, 64, &["--data-dir", dir.arg()]);
    let port = server.port;
    let lines: Vec<Value> = (0..4).map(|i| line(i, 160)).collect();
    let id = submit(port, &lines);
    let t = Instant::now();
    while metric(port, "busy_sessions") < 2.0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the batch never filled the sessions"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let body = json!({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0});
    let r = http(
        port,
        "POST",
        "/v1/chat/completions",
        body.to_string().as_bytes(),
        Some(KEY),
    )
    .expect("interactive");
    assert_eq!(r.status, 200, "{}", r.body);
    let b = batch(port, &id);
    assert_eq!(
        b["request_counts"]["completed"], 0,
        "a batch line finished before the interactive request: {b}"
    );
    assert!(metric(port, "preemptions_total") >= 1.0);
    let b = wait_final(port, &id, Duration::from_secs(300));
    assert_eq!(b["request_counts"]["completed"], 4, "{b}");
}

/// A batch created as private (`X-Anelm-Privacy: local`) never forwards: its lines naming an
/// upstream fail with the privacy refusal, while the same lines in an ordinary batch are sent
/// on (here to an upstream that cannot be reached: 502).
#[test]
fn a_private_batch_never_forwards() {
    let dir = TempDir::new("batches-private");
    let server = start_with(
        2,
        16,
        &["--data-dir", dir.arg(), "--upstream", "big=http://127.0.0.1:9/v1"],
    );
    let port = server.port;
    let lines: Vec<Value> = (0..2)
        .map(|i| {
            let mut l = line(i, 4);
            l["body"]["model"] = json!("big");
            l
        })
        .collect();
    let upload = |lines: &[Value]| {
        let content: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let boundary = "b0undary";
        let body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"p.jsonl\"\r\n\r\n{content}\r\n--{boundary}--\r\n"
        );
        let ct = format!("multipart/form-data; boundary={boundary}");
        let r = http_with(
            port,
            "POST",
            "/v1/files",
            body.as_bytes(),
            Some(KEY),
            &[("Content-Type", &ct)],
        )
        .expect("upload");
        assert_eq!(r.status, 200, "{}", r.body);
        json_of(&r)["id"].as_str().expect("id").to_string()
    };
    let create = |file: &str, private: bool| {
        let req = json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h"});
        let headers: &[(&str, &str)] = if private { &[("X-Anelm-Privacy", "local")] } else { &[] };
        let r = http_with(
            port,
            "POST",
            "/v1/batches",
            req.to_string().as_bytes(),
            Some(KEY),
            headers,
        )
        .expect("create");
        assert_eq!(r.status, 200, "{}", r.body);
        json_of(&r)["id"].as_str().expect("id").to_string()
    };
    let file = upload(&lines);
    for (private, want) in [(true, 403), (false, 502)] {
        let id = create(&file, private);
        let b = wait_final(port, &id, Duration::from_secs(120));
        assert_eq!(b["request_counts"]["failed"], 2, "{b}");
        for l in file_lines(port, &b["error_file_id"]) {
            assert_eq!(l["response"]["status_code"], want, "private={private}: {l}");
        }
    }
}

/// A batch submitted while the model sleeps (`--idle-unload`) wakes it and completes.
#[test]
fn a_batch_wakes_a_sleeping_model() {
    let dir = TempDir::new("batches-idle");
    let server = start_with(2, 16, &["--data-dir", dir.arg(), "--idle-unload", "1"]);
    let port = server.port;
    // The idle time counts from the last request.
    let body = json!({"prompt": "Hello", "max_tokens": 2});
    let r = http(port, "POST", "/v1/completions", body.to_string().as_bytes(), Some(KEY)).expect("request");
    assert_eq!(r.status, 200, "{}", r.body);
    let t = Instant::now();
    while metric(port, "sleeping") < 1.0 {
        assert!(t.elapsed() < Duration::from_secs(30), "the model never slept");
        std::thread::sleep(Duration::from_millis(100));
    }
    let id = submit(port, &[line(0, 8), line(1, 8)]);
    let b = wait_final(port, &id, Duration::from_secs(120));
    assert_eq!(b["request_counts"]["completed"], 2, "{b}");
    assert!(metric(port, "reloads_total") >= 1.0);
}

/// `anelm batch submit --wait`, `status --json`, `results` and `cancel` against a running server.
#[test]
fn the_batch_command_submits_follows_and_fetches() {
    let dir = TempDir::new("batches-cli");
    let server = start_with(2, 16, &["--data-dir", dir.arg()]);
    let input = dir.0.join("in.jsonl");
    let content: String = (0..3).map(|i| format!("{}\n", line(i, 4))).collect();
    std::fs::write(&input, content).expect("write input");
    let anelm = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_anelm"))
            .arg("batch")
            .args(args)
            .args([
                "--url",
                &format!("http://127.0.0.1:{}/v1", server.port),
                "--api-key",
                KEY,
            ])
            .output()
            .expect("run anelm batch");
        assert!(
            out.status.success(),
            "anelm batch {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let id = anelm(&[
        "submit",
        input.to_str().expect("utf-8"),
        "--wait",
        "--metadata",
        "job=notes",
    ]);
    assert!(id.starts_with("batch_"), "{id}");
    let status: Value = serde_json::from_str(&anelm(&["status", &id, "--json"])).expect("status JSON");
    assert_eq!(status["status"], "completed");
    assert_eq!(status["metadata"]["job"], "notes");
    let out = dir.0.join("out.jsonl");
    anelm(&["results", &id, "-o", out.to_str().expect("utf-8")]);
    let got = std::fs::read_to_string(&out).expect("results written");
    assert_eq!(got.lines().count(), 3, "{got}");
    assert!(anelm(&["status"]).contains(&id));
    // A finished batch cannot be cancelled: the command fails with the server's reason.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args([
            "batch",
            "cancel",
            &id,
            "--url",
            &format!("http://127.0.0.1:{}/v1", server.port),
            "--api-key",
            KEY,
        ])
        .output()
        .expect("run");
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("can no longer be cancelled"));
}
