//! The on-disk prompt cache through `anelm serve`: two requests sharing a long system prompt
//! leave its prefix on disk; after a SIGKILL and a restart on the same data directory a third
//! request with that system prompt restores it instead of prefilling it, and answers exactly as
//! a server without the cache does.
//!
//! Needs the default model (`scripts/test.sh`).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod serving;
use serving::*;

fn system_prompt() -> String {
    system_prompt_of(40)
}

fn system_prompt_of(rules: usize) -> String {
    let facts: Vec<String> = (0..rules)
        .map(|i| format!("Rule {i}: file notes about topic {i} under folder {}.", i % 7))
        .collect();
    format!("You sort a person's notes into folders. {}", facts.join(" "))
}

fn ask(port: u16, question: &str) -> String {
    ask_with(port, &system_prompt(), question)
}

fn ask_with(port: u16, system: &str, question: &str) -> String {
    let body = json!({"messages": [{"role": "system", "content": system},
                                    {"role": "user", "content": question}],
                      "max_tokens": 16, "temperature": 0});
    let r = http(
        port,
        "POST",
        "/v1/chat/completions",
        body.to_string().as_bytes(),
        Some(KEY),
    )
    .expect("request");
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = serde_json::from_str(&r.body).expect("JSON");
    v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string()
}

#[test]
fn a_shared_prefix_outlives_a_kill_and_answers_like_a_cold_run() {
    let dir = TempDir::new("prompt-cache");
    let port = free_port();
    let args = ["--data-dir", dir.arg(), "--prompt-cache-min-tokens", "128"];
    let mut server = start_on(port, 2, 16, &args, &[]);
    ask(port, "Where does a note about gardening go?");
    ask(port, "Where does a note about taxes go?");
    let t = Instant::now();
    while metric(port, "prompt_cache_entries") < 1.0 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no prompt-cache entry written in 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) on the pid of a child this test started and has not yet reaped.
    assert_eq!(unsafe { libc::kill(server.child.id() as i32, libc::SIGKILL) }, 0);
    let _ = server.child.wait();
    drop(server);
    server = start_on(port, 2, 16, &args, &[]);
    let question = "Where does a note about birdwatching go?";
    let warm = ask(port, question);
    assert!(
        metric(port, "prompt_cache_hits_total") >= 1.0,
        "the stored prefix was not used"
    );
    assert!(metric(port, "prompt_cache_tokens_restored_total") >= 128.0);
    drop(server);
    let cold_dir = TempDir::new("prompt-cache-cold");
    let cold = start_with(2, 16, &["--data-dir", cold_dir.arg(), "--no-prompt-cache"]);
    assert_eq!(ask(cold.port, question), warm, "the restored prefix changed the answer");
}

/// A hybrid model (the Qwen3.5 GGUF fixture: its DeltaNet state cannot rewind to a prefix it
/// never checkpointed): one request with a long system prompt leaves the system prompt's end on
/// disk (the server's cache hint); after a SIGKILL and a restart another question with that
/// system prompt restores it and answers as a server without the cache does.
#[test]
fn a_hybrid_models_system_prompt_outlives_a_kill() {
    let model =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../anelm-engine/tests/fixtures/gguf/qwen3_5_text.gguf");
    let model = model.to_str().expect("utf-8 path").to_string();
    let dir = TempDir::new("prompt-cache-hybrid");
    let port = free_port();
    let args = [
        "--model",
        &model,
        "--data-dir",
        dir.arg(),
        "--prompt-cache-min-tokens",
        "64",
    ];
    let mut server = start_on(port, 2, 16, &args, &[]);
    let system = system_prompt_of(1);
    ask_with(port, &system, "Where does a note about gardening go?");
    let t = Instant::now();
    while metric(port, "prompt_cache_entries") < 2.0 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the system prompt's entry was not written in 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) on the pid of a child this test started and has not yet reaped.
    assert_eq!(unsafe { libc::kill(server.child.id() as i32, libc::SIGKILL) }, 0);
    let _ = server.child.wait();
    drop(server);
    server = start_on(port, 2, 16, &args, &[]);
    let question = "Where does a note about birdwatching go?";
    let warm = ask_with(port, &system, question);
    assert!(
        metric(port, "prompt_cache_hits_total") >= 1.0,
        "the system prompt was not restored"
    );
    assert!(metric(port, "prompt_cache_tokens_restored_total") >= 64.0);
    drop(server);
    let cold_dir = TempDir::new("prompt-cache-hybrid-cold");
    let cold = start_with(
        2,
        16,
        &["--model", &model, "--data-dir", cold_dir.arg(), "--no-prompt-cache"],
    );
    assert_eq!(
        ask_with(cold.port, &system, question),
        warm,
        "the restored state changed the answer"
    );
}
