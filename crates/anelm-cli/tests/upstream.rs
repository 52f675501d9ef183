//! `anelm serve --upstream`: a second `anelm serve` plays the user's bigger engine on loopback.
//! Requests that name it are forwarded (streaming passed through), private ones never reach it,
//! a dead upstream is a 502 that names it while local requests go on, and `--fallback` takes
//! what the full local queue cannot.
//!
//! Needs the default model and the Python virtualenv (`scripts/test.sh` sets both up).

use std::time::{Duration, Instant};

mod serving;
use serving::*;

const UPSTREAM_KEY_VAR: &str = "ANELM_TEST_UPSTREAM_KEY";

fn chat_body(model: &str, stream: bool) -> String {
    serde_json::json!({
        "model": model, "messages": [{"role": "user", "content": "Name three rivers."}],
        "max_tokens": 12, "temperature": 0, "stream": stream,
    })
    .to_string()
}

/// A non-streamed chat request for `model` (with extra headers) to the server on `port`.
fn chat(port: u16, model: &str, headers: &[(&str, &str)]) -> std::io::Result<Reply> {
    http_with(
        port,
        "POST",
        "/v1/chat/completions",
        chat_body(model, false).as_bytes(),
        Some(KEY),
        headers,
    )
}

fn content(r: &Reply) -> String {
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body));
    v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string()
}

/// The upstream, and a front server forwarding model `big` to it with `extra` flags.
fn pair(front_sessions: usize, front_queue: usize, extra: &[&str]) -> (Server, Server) {
    let upstream = start_with(2, 16, &["--model-id", "smol-up"]);
    let url = format!("big=http://127.0.0.1:{}/v1", upstream.port);
    let mut args = vec![
        "--upstream",
        url.as_str(),
        "--upstream-key",
        "big=ANELM_TEST_UPSTREAM_KEY",
    ];
    args.extend_from_slice(extra);
    let front = start_env(front_sessions, front_queue, &args, &[(UPSTREAM_KEY_VAR, KEY)]);
    (upstream, front)
}

#[test]
fn requests_naming_an_upstream_are_forwarded_and_private_ones_never_leave() {
    let (mut upstream, front) = pair(2, 8, &[]);
    let direct = chat(upstream.port, "smol-up", &[]).expect("direct");
    assert_eq!(direct.status, 200, "{}", direct.body);
    let expected = content(&direct);
    // Named by NAME (rewritten to the upstream's only model) and by NAME/ID.
    for model in ["big", "big/smol-up"] {
        let r = chat(front.port, model, &[]).expect("forwarded");
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(content(&r), expected, "{model}: the upstream's own answer");
        assert!(
            r.headers.to_ascii_lowercase().contains("x-anelm-route: big"),
            "{}",
            r.headers
        );
    }
    // Streamed through anelm with the official client.
    run_client_script("upstream_client.py", front.port, &["big", &expected]);
    // Private: refused before anything is sent; the upstream sees no request.
    let seen = metric(upstream.port, "requests_total");
    let r = chat(front.port, "big", &[("X-Anelm-Privacy", "local")]).expect("refused");
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("private"), "{}", r.body);
    assert_eq!(
        metric(upstream.port, "requests_total"),
        seen,
        "a private request reached the upstream"
    );
    assert_eq!(metric(front.port, "refused_private_total"), 1.0);
    assert_eq!(metric(front.port, "upstream_requests_total{upstream=\"big\"}"), 3.0);
    // A client that goes away mid-stream cancels the request upstream too.
    let long = serde_json::json!({"model": "big", "messages": [{"role": "user", "content": "Tell a long story"}],
                                  "max_tokens": 900, "ignore_eos": true, "stream": true})
    .to_string();
    disconnect_mid_stream(front.port, &long).expect("stream through anelm");
    let t = Instant::now();
    while metric(upstream.port, "requests_cancelled_total") < 1.0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the upstream kept generating for a client that left"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The model list has the local model and the upstream's.
    let models = http(front.port, "GET", "/v1/models", b"", Some(KEY)).expect("models");
    assert!(models.body.contains("\"big/smol-up\""), "{}", models.body);
    // A dead upstream: 502 naming it, and local requests go on.
    let _ = upstream.child.kill();
    let _ = upstream.child.wait();
    let t = Instant::now();
    let r = chat(front.port, "big", &[]).expect("answer");
    assert_eq!(r.status, 502, "{}", r.body);
    assert!(r.body.contains("upstream 'big'"), "{}", r.body);
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "a dead upstream took {:?}",
        t.elapsed()
    );
    let local = chat(front.port, "", &[]).expect("local");
    assert_eq!(local.status, 200, "{}", local.body);
    assert!(metric(front.port, "upstream_failures_total{upstream=\"big\"}") >= 1.0);
}

#[test]
fn private_by_default_keeps_requests_home_and_the_fallback_takes_overflow() {
    let (_upstream, front) = pair(1, 1, &["--private-by-default", "--fallback", "big"]);
    let allow = [("X-Anelm-Privacy", "allow-upstream")];
    let r = chat(front.port, "big", &[]).expect("answer");
    assert_eq!(r.status, 403, "private by default: {}", r.body);
    let r = chat(front.port, "big", &allow).expect("answer");
    assert_eq!(r.status, 200, "{}", r.body);
    // Fill the one local session and the one queue place.
    let port = front.port;
    let busy = occupy_the_session(port);
    let waiting = take_the_queue_place(port, chat_body("", false).as_bytes());
    // Queue full: a request that may leave goes to the fallback; a private one gets 429.
    let r = chat(port, "", &allow).expect("answer");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.headers.to_ascii_lowercase().contains("x-anelm-route: big"),
        "{}",
        r.headers
    );
    let r = chat(port, "", &[]).expect("answer");
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(r.body.contains("private"), "{}", r.body);
    drop(busy);
    assert_eq!(waiting.join().expect("thread").status, 200);
    assert_eq!(metric(port, "refused_private_total"), 2.0);
}

/// 100 mixed requests — local, forwarded, private naming the upstream — with 30 % of the local
/// ones abandoned mid-stream, and the upstream killed and restarted between phases: every
/// request ends in an answer or a clean error, no private request reaches the upstream, no
/// session stays busy and memory comes back near where it was.
#[test]
fn chaos_with_disconnects_and_a_dying_upstream_ends_clean() {
    let up_port = free_port();
    let up_args = ["--model-id", "smol-up"];
    let mut upstream = start_on(up_port, 2, 64, &up_args, &[]);
    let url = format!("big=http://127.0.0.1:{up_port}/v1");
    let front = start_env(
        2,
        64,
        &["--upstream", &url, "--upstream-key", "big=ANELM_TEST_UPSTREAM_KEY"],
        &[(UPSTREAM_KEY_VAR, KEY)],
    );
    let port = front.port;
    let pid = front.child.id();
    // Warm up, then note the memory.
    let _ = chat(port, "", &[]);
    let rss_start = status_kib(pid, "VmRSS");
    let local_stream = |i: usize| {
        serde_json::json!({"messages": [{"role": "user", "content": format!("Story {i}")}],
                           "max_tokens": 48, "stream": true, "temperature": 0.7, "seed": i})
        .to_string()
    };
    // Runs requests `from..to` on 4 threads; returns (forwarded OK, upstream errors, private refused).
    let phase = |from: usize, to: usize, upstream_alive: bool| -> (usize, usize, usize) {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    let (mut ok, mut errs, mut refused) = (0, 0, 0);
                    for i in (from + t..to).step_by(4) {
                        match i % 3 {
                            0 if i % 10 < 3 => {
                                disconnect_mid_stream(port, &local_stream(i)).expect("local stream");
                            }
                            0 => {
                                let r = http(
                                    port,
                                    "POST",
                                    "/v1/chat/completions",
                                    local_stream(i).as_bytes(),
                                    Some(KEY),
                                )
                                .expect("local");
                                assert_eq!(r.status, 200, "local {i}: {}", r.body);
                                assert!(r.body.contains("[DONE]"), "local {i} ended cleanly");
                            }
                            1 => {
                                let r = chat(port, "big", &[]).expect("forwarded");
                                match r.status {
                                    200 if upstream_alive => ok += 1,
                                    502 | 504 if !upstream_alive => errs += 1,
                                    s => panic!("forwarded {i}: {s} {}", r.body),
                                }
                                assert!(
                                    r.body.contains("choices") || r.body.contains("upstream 'big'"),
                                    "{}",
                                    r.body
                                );
                            }
                            _ => {
                                let r = chat(port, "big", &[("X-Anelm-Privacy", "local")]).expect("private");
                                assert_eq!(r.status, 403, "private {i}: {}", r.body);
                                refused += 1;
                            }
                        }
                    }
                    (ok, errs, refused)
                })
            })
            .collect();
        handles.into_iter().fold((0, 0, 0), |acc, h| {
            let (a, b, c) = h.join().expect("client thread");
            (acc.0 + a, acc.1 + b, acc.2 + c)
        })
    };
    let (ok_a, _, refused_a) = phase(0, 50, true);
    let seen_first = metric(up_port, "requests_total");
    assert_eq!(
        seen_first as usize, ok_a,
        "the upstream saw exactly the forwarded requests"
    );
    let _ = upstream.child.kill();
    let _ = upstream.child.wait();
    let (_, errs_b, refused_b) = phase(50, 70, false);
    assert!(errs_b > 0, "requests to a dead upstream got 502/504");
    upstream = start_on(up_port, 2, 64, &up_args, &[]);
    let (ok_c, _, refused_c) = phase(70, 100, true);
    assert_eq!(
        metric(up_port, "requests_total") as usize,
        ok_c,
        "the restarted upstream saw exactly the forwarded ones"
    );
    assert_eq!(
        metric(port, "refused_private_total") as usize,
        refused_a + refused_b + refused_c
    );
    // No session stays busy; memory comes back near its start.
    let t = Instant::now();
    while metric(port, "busy_sessions") > 0.0 || metric(port, "queue_depth") > 0.0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "sessions still busy after the chaos"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    if let (Some(a), Some(b)) = (rss_start, status_kib(pid, "VmRSS")) {
        assert!(b < a + 64 * 1024, "front server memory grew from {a} KiB to {b} KiB");
    }
    drop(upstream);
}

/// `/v1/embeddings` is forwarded too: an upstream serving an embedding model answers through
/// anelm exactly as it answers directly, and a private request for it is refused.
#[test]
fn embedding_requests_naming_an_upstream_are_forwarded() {
    let dir = anelm_engine::default_model::cache_dir()
        .expect("a home directory")
        .join("models/all-MiniLM-L6-v2");
    assert!(
        dir.join("modules.json").is_file(),
        "run scripts/fetch-minilm.sh (scripts/test.sh does)"
    );
    let upstream = start_with(1, 8, &["--embedding-model", dir.to_str().expect("utf-8 path")]);
    let url = format!("big=http://127.0.0.1:{}/v1", upstream.port);
    let front = start_env(
        1,
        8,
        &["--upstream", &url, "--upstream-key", "big=ANELM_TEST_UPSTREAM_KEY"],
        &[(UPSTREAM_KEY_VAR, KEY)],
    );
    let body = |model: &str| serde_json::json!({"model": model, "input": ["a quiet library", "rain"]}).to_string();
    let direct = http(
        upstream.port,
        "POST",
        "/v1/embeddings",
        body("all-MiniLM-L6-v2").as_bytes(),
        Some(KEY),
    )
    .expect("direct");
    assert_eq!(direct.status, 200, "{}", direct.body);
    let through = http(
        front.port,
        "POST",
        "/v1/embeddings",
        body("big/all-MiniLM-L6-v2").as_bytes(),
        Some(KEY),
    )
    .expect("forwarded");
    assert_eq!(through.status, 200, "{}", through.body);
    let vectors = |r: &Reply| {
        let v: serde_json::Value = serde_json::from_str(&r.body).expect("json");
        v["data"].clone()
    };
    assert_eq!(vectors(&through), vectors(&direct));
    let private = http_with(
        front.port,
        "POST",
        "/v1/embeddings",
        body("big/all-MiniLM-L6-v2").as_bytes(),
        Some(KEY),
        &[("X-Anelm-Privacy", "local")],
    )
    .expect("refused");
    assert_eq!(private.status, 403, "{}", private.body);
}
