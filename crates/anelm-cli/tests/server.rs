//! `anelm serve` end to end: the official openai Python client against the server, and a
//! robustness run (200 requests, disconnects mid-stream, malformed and oversized bodies) that
//! must leave no busy session and no memory growth behind.
//!
//! Needs the default model and the Python virtualenv: `scripts/test.sh` sets both up
//! (`scripts/setup-test-env.sh` prints the python it exports as `ANELM_TEST_PYTHON`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

mod serving;
use serving::*;

#[test]
fn the_official_openai_client_works_against_the_server() {
    let server = start(4, 16);
    run_client_script("openai_client.py", server.port, &[]);
    // Without the key: 401 with an OpenAI error body.
    let r = http(server.port, "GET", "/v1/models", b"", None).expect("request");
    assert_eq!(r.status, 401);
    assert!(r.body.contains("\"error\""), "{}", r.body);
    // /metrics too, when the server has a key; /health stays open for probes.
    assert_eq!(
        http(server.port, "GET", "/metrics", b"", None).expect("request").status,
        401
    );
    assert_eq!(
        http(server.port, "GET", "/health", b"", None).expect("request").status,
        200
    );
}

/// Structured outputs (`response_format`, `grammar`) through the official client: 30 generated
/// schemas sampled at temperature 1 all validate, and bad grammars are 400s
/// (`tests/structured_outputs.py`).
#[test]
fn structured_outputs_always_validate_through_the_openai_client() {
    let server = start(4, 64);
    run_client_script("structured_outputs.py", server.port, &[]);
    // The server is still healthy and idle afterwards.
    assert_eq!(metric(server.port, "busy_sessions"), 0.0);
}

/// A tiny deterministic RNG for the robustness mix.
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

#[test]
fn two_hundred_mixed_requests_leave_no_session_busy_and_no_memory_behind() {
    let server = start(4, 256);
    let port = server.port;
    let pid = server.child.id();
    // Warm up so the baseline includes the steady-state buffers.
    let warm = r#"{"messages":[{"role":"user","content":"Hello"}],"max_tokens":4,"temperature":0}"#;
    assert_eq!(
        http(port, "POST", "/v1/chat/completions", warm.as_bytes(), Some(KEY))
            .expect("warm")
            .status,
        200
    );
    // Memory as (RSS, anonymous RSS, session cache bytes / KiB): the caches a session keeps for
    // prompt reuse grow with the longest conversation it has held, which is legitimate; what
    // the server holds beyond them must not grow from one round to the next.
    let memory = || {
        (
            status_kib(pid, "VmRSS"),
            status_kib(pid, "RssAnon"),
            metric(port, "session_cache_bytes") as u64 / 1024,
        )
    };
    let mem_start = memory();

    const N: usize = 200;
    let ok = Arc::new(AtomicUsize::new(0));
    let rejected_as_expected = Arc::new(AtomicUsize::new(0));
    let disconnected = Arc::new(AtomicUsize::new(0));
    let words = [
        "alpha", "river", "stone", "cloud", "seven", "green", "quiet", "north", "paper", "light",
    ];
    let drain = || {
        // Disconnected streams end at their next step: wait for the pool to drain.
        let t = Instant::now();
        while metric(port, "busy_sessions") > 0.0 || metric(port, "queue_depth") > 0.0 {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "sessions still busy 60 s after the last request"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // Two rounds of N/2: memory after the second must be where the first left it (the first
    // fills the session caches, which stay for prompt reuse; a per-request leak would grow).
    let mut mem_after = Vec::new();
    for round in 0..2u64 {
        let next = Arc::new(AtomicUsize::new(round as usize * N / 2));
        let end = (round as usize + 1) * N / 2;
        let workers: Vec<_> = (0..8)
        .map(|w| {
            let (next, ok, rej, disc) = (next.clone(), ok.clone(), rejected_as_expected.clone(), disconnected.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(1000 + w + 100 * round);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
                        return Vec::<String>::new();
                    }
                    let kind = rng.below(100);
                    let n_words = 1 + rng.below(150) as usize;
                    let prompt: Vec<&str> = (0..n_words).map(|_| words[rng.below(10) as usize]).collect();
                    let prompt = prompt.join(" ");
                    let max_tokens = 1 + rng.below(10);
                    if kind < 5 {
                        // Malformed JSON or fields: 400 with an error body.
                        let bad = [r#"{"messages": "#, "[]", r#"{"messages":[{"content":"x"}]}"#, r#"{"prompt": 7}"#];
                        let path = if kind % 2 == 0 { "/v1/chat/completions" } else { "/v1/completions" };
                        let body = bad[(kind % 4) as usize];
                        let r = http(port, "POST", path, body.as_bytes(), Some(KEY)).expect("bad request answered");
                        assert_eq!(r.status, 400, "{body} → {} {}", r.status, r.body);
                        assert!(r.body.contains("\"error\""), "{}", r.body);
                        rej.fetch_add(1, Ordering::Relaxed);
                    } else if kind < 8 {
                        // Oversized: 413 with an error body.
                        let big = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(BODY_LIMIT + 1000));
                        let r = http(port, "POST", "/v1/completions", big.as_bytes(), Some(KEY)).expect("413");
                        assert_eq!(r.status, 413, "{}", r.body);
                        assert!(r.body.contains("\"error\""), "{}", r.body);
                        rej.fetch_add(1, Ordering::Relaxed);
                    } else if kind < 38 {
                        // 30%: a streaming client that hangs up mid-stream.
                        let body = format!(
                            r#"{{"messages":[{{"role":"user","content":"{prompt}"}}],"max_tokens":200,"stream":true}}"#
                        );
                        disconnect_mid_stream(port, &body).expect("stream opened");
                        disc.fetch_add(1, Ordering::Relaxed);
                    } else {
                        let stream = kind % 2 == 0;
                        let body = format!(
                            r#"{{"prompt":"{prompt}","max_tokens":{max_tokens},"temperature":0.7,"seed":{i},"stream":{stream}}}"#
                        );
                        let r = http(port, "POST", "/v1/completions", body.as_bytes(), Some(KEY)).expect("answered");
                        assert_eq!(r.status, 200, "{}", r.body);
                        if stream {
                            assert!(r.body.trim_end().ends_with("data: [DONE]"), "{}", r.body);
                        } else {
                            assert!(r.body.contains("\"usage\""), "{}", r.body);
                        }
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
        for w in workers {
            w.join().expect("worker");
        }
        drain();
        mem_after.push(memory());
    }
    let (ok, rej, disc) = (
        ok.load(Ordering::Relaxed),
        rejected_as_expected.load(Ordering::Relaxed),
        disconnected.load(Ordering::Relaxed),
    );
    println!("well-formed answered: {ok}, bad bodies refused: {rej}, disconnected mid-stream: {disc}");
    assert_eq!(ok + rej + disc, N);
    assert!(
        disc >= 40 && rej >= 5,
        "the mix must exercise disconnects and bad bodies"
    );
    assert!(
        metric(port, "requests_cancelled_total") >= disc as f64 * 0.9,
        "disconnects were not cancelled"
    );
    let show = |(rss, anon, cache): (Option<u64>, Option<u64>, u64)| {
        format!("RSS {rss:?} KiB (anonymous {anon:?}), session caches {cache} KiB")
    };
    println!("after warm-up: {}", show(mem_start));
    for (round, m) in mem_after.iter().enumerate() {
        println!("after round {}: {}", round + 1, show(*m));
    }
    if let ((_, Some(anon0), cache0), [(_, Some(anon1), cache1), ..]) = (mem_start, &mem_after[..]) {
        // The first round fills the step buffers (activations of up to a 132-token step) and
        // the caches; anything per kernel or per request would show far above this.
        let beyond_caches = anon1
            .saturating_sub(anon0)
            .saturating_sub(cache1.saturating_sub(cache0));
        assert!(
            beyond_caches <= 40 * 1024,
            "anonymous memory beyond the session caches grew by {beyond_caches} KiB in the first round"
        );
    }
    if let [(_, Some(anon1), cache1), (_, Some(anon2), cache2)] = mem_after[..] {
        // A per-request leak of 100 requests shows well above this slack (allocator noise).
        let beyond_caches = anon2
            .saturating_sub(anon1)
            .saturating_sub(cache2.saturating_sub(cache1));
        assert!(
            beyond_caches <= 24 * 1024,
            "anonymous memory beyond the session caches grew by {beyond_caches} KiB in the second round"
        );
    }
    // The server still answers normally.
    assert_eq!(
        http(port, "POST", "/v1/chat/completions", warm.as_bytes(), Some(KEY))
            .expect("after")
            .status,
        200
    );
}

#[test]
fn errors_are_openai_shaped() {
    let server = start(1, 1);
    let r = http(server.port, "GET", "/nope", b"", None).expect("404");
    assert_eq!(r.status, 404);
    assert!(r.body.contains("\"error\""));
    let r = http(server.port, "POST", "/v1/chat/completions", b"{", Some(KEY)).expect("400");
    assert_eq!(r.status, 400);
    assert!(r.body.contains("not valid JSON"), "{}", r.body);
    let r = http(
        server.port,
        "POST",
        "/v1/completions",
        br#"{"prompt":"hi","max_tokens":5000}"#,
        Some(KEY),
    )
    .expect("400");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.headers.starts_with("HTTP/1.1"));

    // Queue full: one session busy with a stream, one request waiting, the next gets 429.
    let port = server.port;
    let a = occupy_the_session(port);
    let waiting = take_the_queue_place(port, br#"{"prompt":"Hi","max_tokens":2}"#);
    let r = http(
        port,
        "POST",
        "/v1/completions",
        br#"{"prompt":"Hi","max_tokens":2}"#,
        Some(KEY),
    )
    .expect("429");
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(
        r.headers.to_ascii_lowercase().contains("retry-after: 1"),
        "{}",
        r.headers
    );
    assert!(r.body.contains("queue is full"), "{}", r.body);
    drop(a); // the streaming client leaves; the waiting request gets the session
    let w = waiting.join().expect("waiting thread");
    assert_eq!(w.status, 200, "{}", w.body);
}

/// A thinking model's `<think>` text goes to `reasoning_content`, streamed and not; with
/// `enable_thinking: false` everything is content. The default model is made to "think" by a
/// Qwen3-style template (`--chat-template`) and a grammar that shapes its answer.
#[test]
fn think_blocks_become_reasoning_content() {
    let template = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/thinking-template.jinja");
    let server = start_with(2, 8, &["--chat-template", template.to_str().expect("utf-8 path")]);
    let grammar = r#"start: "<think>" /[a-z]{1,12}/ "</think>" "\n\n" /[A-Z][a-z]{1,12}/"#;
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": "Say a word."}],
        "max_tokens": 40, "temperature": 0, "grammar": grammar,
    });
    let r = http(
        server.port,
        "POST",
        "/v1/chat/completions",
        body.to_string().as_bytes(),
        Some(KEY),
    )
    .expect("reply");
    assert_eq!(r.status, 200, "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).expect("json");
    let msg = &v["choices"][0]["message"];
    let reasoning = msg["reasoning_content"]
        .as_str()
        .expect("reasoning_content")
        .to_string();
    let content = msg["content"].as_str().expect("content").to_string();
    assert!(
        !reasoning.is_empty() && reasoning.chars().all(|c| c.is_ascii_lowercase()),
        "{msg}"
    );
    assert!(
        content.starts_with(|c: char| c.is_ascii_uppercase()) && !content.contains("think"),
        "{msg}"
    );
    // Streamed: the same split, as delta.reasoning_content then delta.content.
    let mut sbody = body.clone();
    sbody["stream"] = serde_json::json!(true);
    let r = http(
        server.port,
        "POST",
        "/v1/chat/completions",
        sbody.to_string().as_bytes(),
        Some(KEY),
    )
    .expect("reply");
    let (mut sr, mut sc) = (String::new(), String::new());
    for line in r.body.lines() {
        let Some(data) = line.strip_prefix("data: ").filter(|d| *d != "[DONE]") else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(data).expect("chunk json");
        let d = &v["choices"][0]["delta"];
        sr.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        sc.push_str(d["content"].as_str().unwrap_or(""));
    }
    assert_eq!((sr.as_str(), sc.as_str()), (reasoning.as_str(), content.as_str()));
    // Thinking off: the template closes the block in the prompt, the answer is all content.
    let off = serde_json::json!({
        "messages": [{"role": "user", "content": "Say a word."}],
        "max_tokens": 10, "temperature": 0, "grammar": {"regex": "[A-Z][a-z]{1,8}"},
        "chat_template_kwargs": {"enable_thinking": false},
    });
    let r = http(
        server.port,
        "POST",
        "/v1/chat/completions",
        off.to_string().as_bytes(),
        Some(KEY),
    )
    .expect("reply");
    let v: serde_json::Value = serde_json::from_str(&r.body).expect("json");
    let msg = &v["choices"][0]["message"];
    assert!(msg.get("reasoning_content").is_none(), "{msg}");
    assert!(msg["content"].as_str().is_some_and(|c| !c.is_empty()), "{msg}");
}

/// `--background`: every thread of the server (runtime, scheduler, kernel pool) runs at nice 19
/// under SCHED_IDLE, and it still answers.
#[cfg(target_os = "linux")]
#[test]
fn background_priority_reaches_every_thread() {
    let server = start_with(1, 4, &["--background"]);
    let r = http(
        server.port,
        "POST",
        "/v1/completions",
        br#"{"prompt":"Hi","max_tokens":2}"#,
        Some(KEY),
    )
    .expect("answer");
    assert_eq!(r.status, 200, "{}", r.body);
    let pid = server.child.id();
    let tasks: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("threads")
        .filter_map(|e| e.ok())
        .collect();
    assert!(tasks.len() >= 4, "the server runs several threads ({})", tasks.len());
    for t in tasks {
        let stat = std::fs::read_to_string(t.path().join("stat")).expect("stat");
        // Fields after the command name (which may hold spaces): state is field 3, nice 19.
        let after = &stat[stat.rfind(')').expect("comm") + 2..];
        let nice: i32 = after
            .split_whitespace()
            .nth(16)
            .and_then(|n| n.parse().ok())
            .expect("nice");
        assert_eq!(nice, 19, "thread {:?}", t.file_name());
        let sched = std::fs::read_to_string(t.path().join("sched")).unwrap_or_default();
        if let Some(policy) = sched.lines().find(|l| l.starts_with("policy")) {
            assert!(policy.trim_end().ends_with('5'), "SCHED_IDLE is policy 5: {policy}");
        }
    }
}

/// `--idle-unload`: after a second without requests the model is released (`/health` says
/// sleeping, the process gives memory back), and the next request reloads it and is answered.
#[test]
fn an_idle_server_releases_its_model_and_the_next_request_reloads_it() {
    let server = start_with(1, 4, &["--idle-unload", "1"]);
    let ask = || {
        http(
            server.port,
            "POST",
            "/v1/completions",
            br#"{"prompt":"The capital of France is","max_tokens":4,"temperature":0}"#,
            Some(KEY),
        )
        .expect("answer")
    };
    let first = ask();
    assert_eq!(first.status, 200, "{}", first.body);
    let awake = metric(server.port, "resident_bytes");
    let t = Instant::now();
    loop {
        let h = http(server.port, "GET", "/health", b"", None).expect("health");
        if h.body.contains("sleeping") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "never slept: {}", h.body);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(metric(server.port, "sleeping"), 1.0);
    // `/health` says sleeping once the model is taken out of service; the scheduler's thread is
    // joined and the memory freed right after, which on a loaded host can take a moment.
    let t = Instant::now();
    let asleep = loop {
        let now = metric(server.port, "resident_bytes");
        if now < awake - 40.0 * 1024.0 * 1024.0 || t.elapsed() > Duration::from_secs(10) {
            break now;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("resident: {awake} bytes awake, {asleep} asleep");
    assert!(
        asleep < awake - 40.0 * 1024.0 * 1024.0,
        "sleeping gives the model's memory back within 10 s: {awake} -> {asleep} bytes"
    );
    let again = ask();
    assert_eq!(again.status, 200, "{}", again.body);
    // The same greedy answer as before the sleep.
    let text = |r: &Reply| {
        let v: serde_json::Value = serde_json::from_str(&r.body).expect("json");
        v["choices"][0]["text"].as_str().unwrap_or_default().to_string()
    };
    assert_eq!(text(&again), text(&first));
    assert_eq!(metric(server.port, "reloads_total"), 1.0);
    assert!(metric(server.port, "last_reload_seconds") > 0.0);
    let h = http(server.port, "GET", "/health", b"", None).expect("health");
    assert!(h.body.contains("\"ok\""), "{}", h.body);
}

/// `--speculate PATH`: the server loads a draft model (here the model itself, so its greedy
/// drafts are kept) and requests draft with it by default or with `"speculate": "draft"`; the
/// text is the text without speculation, and `/metrics` counts the drafts. A server without a
/// draft model refuses `"draft"` as a bad request.
#[test]
fn a_draft_model_drafts_for_the_server_without_changing_the_text() {
    let draft = anelm_engine::default_model::default_model_location().expect("a home directory");
    let draft = draft.to_str().expect("utf-8 path");
    let server = start_with(2, 8, &["--speculate", draft, "--draft-tokens", "6"]);
    let ask = |port: u16, speculate: &str| {
        let body = format!(
            r#"{{"prompt":"Copy this list exactly: apples, pears, plums, apples, pears, plums,","max_tokens":24,"temperature":0,"speculate":{speculate}}}"#
        );
        http(port, "POST", "/v1/completions", body.as_bytes(), Some(KEY)).expect("answer")
    };
    let text = |r: &Reply| {
        assert_eq!(r.status, 200, "{}", r.body);
        let v: serde_json::Value = serde_json::from_str(&r.body).expect("json");
        v["choices"][0]["text"].as_str().unwrap_or_default().to_string()
    };
    let plain = text(&ask(server.port, "\"off\""));
    assert_eq!(metric(server.port, "draft_tokens_total"), 0.0);
    let drafted = text(&ask(server.port, "\"draft\""));
    let by_default = text(&ask(server.port, "null"));
    let by_lookup = text(&ask(server.port, "\"lookup\""));
    assert_eq!(drafted, plain);
    assert_eq!(by_default, plain);
    assert_eq!(by_lookup, plain);
    let (drafts, kept) = (
        metric(server.port, "draft_tokens_total"),
        metric(server.port, "draft_accepted_total"),
    );
    eprintln!("{kept} of {drafts} drafted tokens kept");
    // Two requests of 23 decoded tokens each drafted by the model itself: nearly all kept.
    assert!(kept >= 30.0, "{kept} of {drafts} drafts kept");
    drop(server);
    let plain_server = start(1, 4);
    let r = ask(plain_server.port, "\"draft\"");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("no draft model"), "{}", r.body);
}
