//! The command-line contract that outside checks rely on, exercised on the real default model.
//! Needs the default model (`scripts/fetch-default-model.sh`; `scripts/test.sh` runs it first).

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn anelm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args(args)
        .args(["--threads", "2"])
        .output()
        .expect("run anelm")
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "anelm failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

fn fixture_case0() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/llamacpp/smollm2-llamacpp-greedy.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json");
    v["cases"][0].clone()
}

fn assert_one_line_error(o: &Output, needle: &str) {
    assert!(!o.status.success(), "expected failure");
    assert_eq!(o.status.code(), Some(1), "exit code (101 would be a panic)");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one-line error, got: {err}");
    assert!(
        err.starts_with("error: ") && err.contains(needle),
        "error mentions {needle:?}: {err}"
    );
}

#[test]
fn tokenize_prints_llama_cpp_ids() {
    let case = fixture_case0();
    let out = stdout(&anelm(&["tokenize", case["prompt"].as_str().unwrap()]));
    let got: Value = serde_json::from_str(out.trim()).expect("JSON array");
    assert_eq!(got, case["prompt_ids"]);
}

#[test]
fn raw_greedy_generation_matches_llama_cpp_text() {
    let case = fixture_case0();
    let o = anelm(&[
        "generate",
        "--raw",
        "--temp",
        "0",
        "--max-tokens",
        "8",
        case["prompt"].as_str().unwrap(),
    ]);
    let text = stdout(&o);
    let text = text.strip_suffix('\n').unwrap_or(&text);
    assert!(!text.is_empty());
    assert!(
        case["completion_text"].as_str().unwrap().starts_with(text),
        "{text:?} is not a prefix of llama.cpp's greedy text"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("tok/s"), "speeds on stderr: {err}");
}

/// `--stop` ends the text where the stop string starts (the string itself is not printed), as the
/// server's `stop` does: both run through the engine's one `Stream`.
#[test]
fn stop_strings_end_generation_before_the_string() {
    let case = fixture_case0();
    let reference = case["completion_text"].as_str().unwrap();
    let at = reference
        .find("United")
        .expect("the fixture's text has the stop string");
    let o = anelm(&[
        "generate",
        "--raw",
        "--temp",
        "0",
        "--max-tokens",
        "40",
        "--stop",
        "United",
        case["prompt"].as_str().unwrap(),
    ]);
    let text = stdout(&o);
    assert_eq!(text.strip_suffix('\n').unwrap_or(&text), &reference[..at]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("(Stop)"),
        "finish reason on stderr"
    );
}

#[test]
fn logits_json_has_one_vocab_row_per_position() {
    let case = fixture_case0();
    let ids: Vec<String> = case["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.to_string())
        .collect();
    let joined = ids.join(",");
    let out = stdout(&anelm(&[
        "logits",
        "--token-ids",
        &joined,
        "--all-positions",
        "--device",
        "cpu",
    ]));
    let v: Value = serde_json::from_str(&out).expect("JSON");
    let rows = v["logits"].as_array().expect("logits rows");
    assert_eq!(rows.len(), ids.len());
    for r in rows {
        assert_eq!(r.as_array().unwrap().len(), 49152);
    }
    // The last row's argmax is llama.cpp's first greedy token.
    let last: Vec<f64> = rows
        .last()
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let argmax = (0..last.len()).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap();
    assert_eq!(argmax as u64, case["completion_ids"][0].as_u64().unwrap());
    // Without --all-positions only the last row is printed, and it is the same row.
    let out1 = stdout(&anelm(&["logits", "--token-ids", &joined]));
    let v1: Value = serde_json::from_str(&out1).expect("JSON");
    assert_eq!(v1["logits"].as_array().unwrap().len(), 1);
    assert_eq!(v1["logits"][0], *rows.last().unwrap());
}

#[test]
fn inspect_shows_architecture_and_tensors() {
    let out = stdout(&anelm(&["inspect"]));
    assert!(out.contains("architecture: llama"), "{out}");
    assert!(out.contains("token_embd.weight"), "{out}");
    assert!(out.contains("tensors: 272"), "{out}");
}

/// A prefill figure carries its matmuls' rate and the unit they ran on; where the unit's peak is
/// measured, the achieved rate stays below it (a count of multiply-accumulates that was too
/// large would show as a rate above what the silicon can do).
#[test]
fn bench_prefill_reports_its_matmul_rate_beside_the_units_peak() {
    let out = stdout(&anelm(&["bench", "-p", "64", "-n", "0", "-r", "2", "--json"]));
    let row: Value = serde_json::from_str(out.lines().next().expect("one line")).expect("JSON line");
    assert_eq!(row["test"], "pp64", "{row}");
    let gops = row["matmul_gops"].as_f64().expect("a matmul rate");
    assert!(gops > 0.0, "{row}");
    assert!(row["compute_unit"].as_str().is_some_and(|u| !u.is_empty()), "{row}");
    if let Some(peak) = row["unit_peak_gops"].as_f64() {
        assert!(
            gops < 1.1 * peak,
            "achieved {gops} GOPS above the measured peak {peak}: {row}"
        );
    }
}

#[test]
fn bench_parallel_reports_one_batched_decode_figure_per_level() {
    let out = stdout(&anelm(&[
        "bench",
        "-p",
        "0",
        "-n",
        "4",
        "--parallel",
        "1,3",
        "-r",
        "2",
        "--json",
    ]));
    let rows: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(rows.len(), 3, "{out}");
    for (row, (test, tokens)) in rows.iter().zip([("tg4", 4), ("tg4 x3", 12), ("tg4 generate", 4)]) {
        assert_eq!(row["test"], test, "{row}");
        assert_eq!(row["tokens"].as_u64(), Some(tokens), "{row}");
        assert_eq!(
            row["tok_s"].as_array().map(Vec::len),
            Some(2),
            "one rate per repetition: {row}"
        );
        assert!(row["tok_s_median"].as_f64().is_some_and(|r| r > 0.0), "{row}");
    }
    // The generate row splits each token's time between the forward and the rest; the batched
    // rows have no such split.
    let forward = rows[2]["forward_us_per_token"].as_f64().expect("forward µs");
    let outside = rows[2]["outside_forward_us_per_token"].as_f64().expect("outside µs");
    assert!(forward > 0.0 && outside >= 0.0, "{}", rows[2]);
    assert!(rows[0]["forward_us_per_token"].is_null(), "{}", rows[0]);
    for bad in ["1,0", "100000"] {
        assert_one_line_error(
            &anelm(&["bench", "--parallel", bad]),
            "--parallel levels must be between 1 and",
        );
    }
}

#[test]
fn bad_inputs_give_one_line_errors() {
    assert_one_line_error(
        &anelm(&["generate", "--model", "/nonexistent/model.gguf", "hi"]),
        "/nonexistent/model.gguf",
    );
    assert_one_line_error(&anelm(&["logits", "--token-ids", "1,x"]), "not a token id");
    assert_one_line_error(&anelm(&["logits", "--token-ids", "99999999"]), "outside the vocabulary");
    // A truncated model file.
    let src = anelm_engine::default_model::default_model_location().unwrap();
    let bytes = std::fs::read(&src).unwrap();
    let dir = std::env::temp_dir().join(format!("anelm-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for cut in [10usize, 4096, bytes.len() / 2] {
        let p = dir.join(format!("cut{cut}.gguf"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let o = anelm(&["generate", "--model", p.to_str().unwrap(), "hi"]);
        assert_one_line_error(&o, "could not load the model");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn quantize_takes_known_formats_only_and_keeps_block_formats() {
    // An unknown value is clap's usage error (exit 2), naming the choices.
    let o = anelm(&["logits", "--quantize", "q3_x", "--token-ids", "1"]);
    assert_eq!(o.status.code(), Some(2), "usage error");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("invalid value 'q3_x' for '--quantize <FORMAT>'")
            && err.contains("choose one of: q8_0, q4_0, q4_k"),
        "{err}"
    );
    // The Neural Engine stores its own weights.
    assert_one_line_error(
        &anelm(&[
            "logits",
            "--device",
            "ane-emu",
            "--quantize",
            "q8_0",
            "--token-ids",
            "1",
        ]),
        "re-encodes weights for the CPU backend",
    );
    // The default model's matrices are all Q4_1 blocks: nothing to re-encode, same logits.
    let args = ["logits", "--device", "cpu", "--token-ids", "504,3575,282"];
    let plain = stdout(&anelm(&args));
    let quantized = stdout(&anelm(&[&args[..], &["--quantize", "q8_0"]].concat()));
    assert_eq!(plain, quantized);
}

#[test]
fn missing_default_model_says_how_to_fetch_it() {
    let empty = std::env::temp_dir().join(format!("anelm-empty-cache-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args(["generate", "hello"])
        .env("XDG_CACHE_HOME", &empty)
        .env_remove("ANELM_MODEL")
        .output()
        .unwrap();
    assert_one_line_error(&o, "scripts/fetch-default-model.sh");
    std::fs::remove_dir_all(&empty).ok();
}

/// `anelm service install` writes a definition that runs this binary's `serve` with the given
/// arguments (checked first), and `uninstall` removes it; `--no-start` leaves the service
/// manager alone, and `ANELM_SERVICE_DIR` points at a scratch directory.
#[test]
fn service_install_writes_a_definition_and_uninstall_removes_it() {
    let dir = std::env::temp_dir().join(format!("anelm-service-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_anelm"))
            .args(args)
            .env("ANELM_SERVICE_DIR", &dir)
            .output()
            .expect("run anelm")
    };
    let o = run(&[
        "service",
        "install",
        "--no-start",
        "--",
        "--background",
        "--idle-unload",
        "600",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let file = std::fs::read_dir(&dir)
        .expect("dir")
        .next()
        .expect("a definition")
        .expect("entry")
        .path();
    let text = std::fs::read_to_string(&file).expect("definition");
    assert!(
        text.contains("serve") && text.contains("--idle-unload") && text.contains("600"),
        "{text}"
    );
    let bad = run(&["service", "install", "--no-start", "--", "--no-such-flag"]);
    assert_one_line_error(&bad, "serve arguments are invalid");
    let o = run(&["service", "uninstall", "--no-start"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!file.exists(), "uninstall removes {}", file.display());
    let _ = std::fs::remove_dir_all(&dir);
}
