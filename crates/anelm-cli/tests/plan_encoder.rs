//! `anelm plan` on an encoder (all-MiniLM-L6-v2's directory): 24 dispatches per 32-token step,
//! tokens/s = 32 / step, embeddings/s = tokens/s ÷ `--seq-len`, a table row per chip; a length
//! past the model's position table is a one-line error. Needs all-MiniLM-L6-v2
//! (`scripts/fetch-minilm.sh`; `scripts/test.sh` runs it first).

use std::process::Command;

use serde_json::Value;

fn minilm() -> String {
    let dir = anelm_engine::default_model::default_embedding_model_location().expect("a home directory");
    assert!(
        dir.join("config.json").is_file(),
        "{} is missing: run scripts/fetch-minilm.sh (scripts/test.sh does)",
        dir.display()
    );
    dir.to_string_lossy().into_owned()
}

fn plan(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_anelm"))
        .arg("plan")
        .args(args)
        .output()
        .expect("run anelm plan")
}

#[test]
fn an_encoder_plan_models_tokens_and_embeddings_per_second() {
    let model = minilm();
    let o = plan(&["--model", &model, "--seq-len", "64", "--chip", "m3-max", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["kind"], "encoder");
    assert_eq!(v["dispatches_per_step"], 24);
    assert_eq!(v["tokens_per_step"], 32);
    let step = v["step_ms"].as_f64().expect("step_ms");
    let tok = v["tokens_per_s"].as_f64().expect("tokens_per_s");
    let emb = v["embeddings_per_s"].as_f64().expect("embeddings_per_s");
    assert!((tok - 32.0 / (step / 1e3)).abs() < 1e-6 * tok, "{v}");
    assert!((emb - tok / 64.0).abs() < 1e-6 * emb, "{v}");
    // The step is the dispatches plus the host's work, which includes attention over the text.
    let (ane, host) = (
        v["ane_step_ms"].as_f64().expect("ane"),
        v["host_step_ms"].as_f64().expect("host"),
    );
    assert!(
        ane > 0.0 && host > 0.0 && (ane + host - step).abs() < 1e-9 * step,
        "{v}"
    );
    assert!(
        v["ms_per_token"]["host attention"].as_f64().is_some_and(|t| t > 0.0),
        "{v}"
    );
    let long: Value =
        serde_json::from_slice(&plan(&["--model", &model, "--seq-len", "256", "--chip", "m3-max", "--json"]).stdout)
            .expect("JSON");
    assert!(
        long["host_step_ms"].as_f64().expect("host") > host,
        "longer texts cost the host more: {long}"
    );
    assert!(
        (v["single_text_ms"].as_f64().expect("single") - 2.0 * step).abs() < 1e-9,
        "{v}"
    );

    let table = plan(&["--model", &model]);
    assert!(table.status.success());
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("24 dispatches per step of 32 tokens"), "{text}");
    assert!(text.contains("| m3-max |") && text.contains("| m5-max |"), "{text}");

    let bad = plan(&["--model", &model, "--seq-len", "513"]);
    assert_eq!(bad.status.code(), Some(1), "exit code (101 would be a panic)");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("--seq-len must be from 1 to 512"), "{err}");
}
