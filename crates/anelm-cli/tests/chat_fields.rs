//! The chat-completions fields clients send (logit_bias, the legacy functions, reasoning_effort,
//! repetition_penalty, modalities, nulls) through the official openai client
//! (`tests/chat_fields.py`). Needs the default model and the virtualenv (`scripts/test.sh`).

use std::process::Command;

mod serving;
use serving::*;

/// The single token id of `text` in the default model's vocabulary.
fn token_id(text: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args(["tokenize", text])
        .output()
        .expect("anelm tokenize");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ids: Vec<u32> = serde_json::from_slice(&out.stdout).expect("a JSON array");
    assert_eq!(ids.len(), 1, "'{text}' is not one token: {ids:?}");
    ids[0].to_string()
}

#[test]
fn newer_chat_fields_work_through_the_openai_client() {
    let (yes, no) = (token_id("Yes"), token_id("No"));
    let server = start(2, 16);
    run_client_script("chat_fields.py", server.port, &[&yes, &no]);
}
