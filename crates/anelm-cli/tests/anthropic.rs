//! Anthropic's Messages API end to end: the official `anthropic` Python client against
//! `anelm serve` (`tests/anthropic_client.py`: plain, system, multi-turn, streamed, stop
//! sequences, max_tokens, forced tool calls and their results, count_tokens, keys, bad input),
//! thinking blocks from a thinking template, and the error shape and keys over raw HTTP.
//!
//! Needs the default model and the Python virtualenv: `scripts/test.sh` sets both up
//! (`scripts/setup-test-env.sh` installs the pinned `anthropic` client).

use std::path::PathBuf;

mod serving;
use serving::*;

#[test]
fn the_official_anthropic_client_works_against_the_server() {
    let server = start(4, 16);
    run_client_script("anthropic_client.py", server.port, &[]);
    // Every request finished and freed its session.
    assert_eq!(metric(server.port, "busy_sessions"), 0.0);
}

/// A template that opens `<think>` in the prompt makes the default model "think": its answer
/// comes back as a thinking block first (streamed as thinking_delta), and as text with
/// `thinking: {"type": "disabled"}`.
#[test]
fn thinking_answers_start_with_thinking_blocks() {
    let template = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/thinking-open-template.jinja");
    let server = start_with(2, 8, &["--chat-template", template.to_str().expect("utf-8 path")]);
    run_client_script("anthropic_client.py", server.port, &["thinking"]);
}

#[test]
fn messages_errors_are_anthropic_shaped_and_keys_work_everywhere() {
    let server = start(1, 4);
    let port = server.port;
    let json = |r: &Reply| -> serde_json::Value { serde_json::from_str(&r.body).expect("a JSON body") };
    let body = br#"{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"Hi"}]}"#;
    // No key, a wrong key: 401 authentication_error.
    for extra in [&[][..], &[("x-api-key", "wrong")][..]] {
        let r = http_with(port, "POST", "/v1/messages", body, None, extra).expect("reply");
        assert_eq!(r.status, 401, "{}", r.body);
        assert_eq!(json(&r)["type"], "error");
        assert_eq!(json(&r)["error"]["type"], "authentication_error", "{}", r.body);
    }
    // x-api-key (with anthropic-version) or a bearer token on this route, and x-api-key on the
    // OpenAI routes too.
    let anthropic = [("x-api-key", KEY), ("anthropic-version", "2023-06-01")];
    let r = http_with(port, "POST", "/v1/messages", body, None, &anthropic).expect("reply");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r)["type"], "message");
    assert_eq!(
        http(port, "POST", "/v1/messages", body, Some(KEY))
            .expect("reply")
            .status,
        200
    );
    let r = http_with(port, "GET", "/v1/models", b"", None, &anthropic).expect("reply");
    assert_eq!(r.status, 200, "{}", r.body);
    let chat = br#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2}"#;
    let r = http_with(port, "POST", "/v1/chat/completions", chat, None, &anthropic).expect("reply");
    assert_eq!(r.status, 200, "{}", r.body);
    // Malformed and refused bodies: 400 invalid_request_error naming the problem.
    for (bad, mentions) in [
        (&b"{"[..], "not valid JSON"),
        (br#"{"messages":[{"role":"user","content":"Hi"}]}"#, "max_tokens"),
        (
            br#"{"max_tokens":2,"messages":[{"role":"tool","content":"Hi"}]}"#,
            "messages[0].role",
        ),
        (
            br#"{"max_tokens":2,"messages":[{"role":"user","content":"Hi"}],"top_logprobs":2}"#,
            "top_logprobs",
        ),
        (
            br#"{"max_tokens":2,"messages":[{"role":"user","content":"Hi"}],"temperature":-1}"#,
            "temperature",
        ),
    ] {
        let r = http(port, "POST", "/v1/messages", bad, Some(KEY)).expect("reply");
        assert_eq!(r.status, 400, "{}", r.body);
        let v = json(&r);
        assert_eq!(v["error"]["type"], "invalid_request_error", "{}", r.body);
        let msg = v["error"]["message"].as_str().expect("a message");
        assert!(msg.contains(mentions), "{mentions}: {msg}");
    }
    // A streamed request that fails before it starts is a plain error answer, not a stream.
    let r = http(
        port,
        "POST",
        "/v1/messages",
        br#"{"max_tokens":5000,"stream":true,"messages":[{"role":"user","content":"Hi"}]}"#,
        Some(KEY),
    )
    .expect("reply");
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(json(&r)["error"]["type"], "invalid_request_error");
    // count_tokens takes no generation fields.
    let r = http(
        port,
        "POST",
        "/v1/messages/count_tokens",
        br#"{"max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}"#,
        Some(KEY),
    )
    .expect("reply");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body.contains("not a field of /v1/messages/count_tokens"),
        "{}",
        r.body
    );
}
