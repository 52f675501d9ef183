//! The ANE commands: `anelm plan` on the committed Qwen3.5-4B / 9B configs against the C++
//! system's measured decode rates, `--chip` validation, `anelm compile` through the compile
//! cache, and `--device ane-emu` logits against the CPU's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn anelm(args: &[&str], cache: Option<&Path>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_anelm"));
    c.args(args);
    if let Some(dir) = cache {
        c.env("ANELM_CACHE_DIR", dir);
    }
    c.output().expect("run anelm")
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "anelm failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

fn tiny_qwen35() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../anelm-engine/tests/fixtures/hf/qwen3_5")
        .display()
        .to_string()
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("anelm-{tag}-{}", std::process::id()));
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

/// ane-runtime.md §11 (README 7c61e4e, M3 Max): the C++ system's single-stream decode.
#[test]
fn plan_on_m3_max_is_within_35_percent_of_the_cpp_measurements() {
    let cases = [
        ("qwen3_5_4b", "fp16", 9.21),
        ("qwen3_5_4b", "int8", 11.66),
        ("qwen3_5_9b", "fp16", 4.27),
        ("qwen3_5_9b", "int8", 7.01),
    ];
    for (model, weights, measured) in cases {
        let path = fixture(model);
        let args = ["plan", "--model", &path, "--chip", "m3-max", "--weights", weights];
        let json: Value = serde_json::from_str(stdout(&anelm(&[&args[..], &["--json"]].concat(), None)).trim())
            .expect("one JSON object");
        for key in [
            "model",
            "chip",
            "weights",
            "dispatches_per_token",
            "weight_bytes_per_token",
            "decode_tok_s",
            "prefill_tok_s",
        ] {
            assert!(
                json.get(key).is_some(),
                "{model} {weights}: key {key} missing in {json}"
            );
        }
        assert_eq!(json["chip"], "m3-max");
        assert_eq!(json["weights"], weights);
        assert_eq!(json["measured_cpp_tok_s"].as_f64(), Some(measured));
        let modelled = json["decode_tok_s"]["1"].as_f64().expect("decode_tok_s.1");
        let off = modelled / measured - 1.0;
        assert!(
            off.abs() <= 0.35,
            "{model} {weights}: modelled {modelled:.2} vs measured {measured} ({:+.0} %)",
            off * 100.0
        );
        // Streams share each dispatch's lanes: 4 streams cost one step, not four.
        let four = json["decode_tok_s"]["4"].as_f64().expect("decode_tok_s.4");
        assert!((four / modelled - 4.0).abs() < 1e-6, "{four} vs 4 × {modelled}");
        // The table prints the modelled figure beside the measured one.
        let text = stdout(&anelm(&args, None));
        assert!(
            text.contains(&format!("modelled {modelled:.2} tok/s vs {measured:.2} measured")),
            "{text}"
        );
        assert!(text.contains("why: "), "{text}");
    }
    // 4B: 24 DeltaNet + 8 attention layers × 3 kernels + 4 LM-head chunks; 9B splits its FFN.
    let dispatches = |model: &str| -> u64 {
        let v: Value =
            serde_json::from_str(stdout(&anelm(&["plan", "--model", &fixture(model), "--json"], None)).trim())
                .expect("json");
        v["dispatches_per_token"].as_u64().expect("count")
    };
    assert_eq!(dispatches("qwen3_5_4b"), 100);
    assert_eq!(dispatches("qwen3_5_9b"), 32 * 4 + 4);
}

#[test]
fn plan_without_chip_lists_every_profile_and_bad_chips_are_named() {
    let text = stdout(&anelm(&["plan", "--model", &fixture("qwen3_5_4b")], None));
    for chip in ["m1", "m2-max", "m3-max", "m4-pro", "m5-max"] {
        assert!(text.contains(&format!("| {chip} |")), "{chip} missing:\n{text}");
    }
    let o = anelm(&["plan", "--model", &fixture("qwen3_5_4b"), "--chip", "m9"], None);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("unknown --chip 'm9'") && err.contains("m3-max"), "{err}");
    let o = anelm(&["generate", "--device", "ane-emu", "--chip", "m9", "hi"], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("m1, m1-pro"));
}

#[test]
fn compile_fills_the_cache_and_a_second_run_loads_from_it() {
    let dir = TempDir::new("compile-cache");
    let model = tiny_qwen35();
    let run = |extra: &[&str]| {
        stdout(&anelm(
            &[&["compile", "--model", &model][..], extra].concat(),
            Some(&dir.0),
        ))
    };
    let first = run(&[]);
    assert!(first.contains("13 ANE programs on ane-emu"), "{first}");
    assert!(first.contains("13 compiled, 0 loaded from the cache"), "{first}");
    let markers = dir.0.join("ane/compiled_markers");
    assert_eq!(std::fs::read_dir(&markers).expect("markers").count(), 13);
    let second = run(&[]);
    assert!(second.contains("0 compiled, 13 loaded from the cache"), "{second}");
    // int8 programs are different programs: compiled afresh.
    let int8 = run(&["--ane-weights", "int8"]);
    assert!(int8.contains("13 compiled, 0 loaded"), "{int8}");
    // --no-ane-cache neither reads nor writes markers.
    let off = run(&["--no-ane-cache"]);
    assert!(
        off.contains("13 compiled, 0 loaded") && off.contains("cache off"),
        "{off}"
    );
    assert_eq!(std::fs::read_dir(&markers).expect("markers").count(), 26);
    let o = anelm(&["compile", "--model", &model, "--device", "cpu"], Some(&dir.0));
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn ane_emu_logits_agree_with_the_cpu() {
    let dir = TempDir::new("logits");
    let model = tiny_qwen35();
    let logits = |device: &str| -> (Vec<f64>, String) {
        let o = anelm(
            &[
                "logits",
                "--model",
                &model,
                "--device",
                device,
                "--token-ids",
                "192,117,278,73,228",
            ],
            Some(&dir.0),
        );
        let v: Value = serde_json::from_str(stdout(&o).trim()).expect("json");
        let row = v["logits"][0]
            .as_array()
            .expect("row")
            .iter()
            .map(|x| x.as_f64().expect("number"))
            .collect();
        (row, String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (cpu, _) = logits("cpu");
    let (ane, err) = logits("ane-emu");
    let dot: f64 = cpu.iter().zip(&ane).map(|(a, b)| a * b).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let cos = dot / (norm(&cpu) * norm(&ane));
    assert!(cos >= 0.999, "cosine {cos}");
    // Host time and modelled ANE time are reported separately: 13 kernels, 1 group of 5 lanes.
    assert!(err.contains("ane-emu (m3-max): prefill: 13 dispatches"), "{err}");
    assert!(err.contains("measured") && err.contains("modelled"), "{err}");
}

/// `anelm plan` from a GGUF's metadata (the default model) and from a safetensors directory, and
/// `anelm bench --device ane-emu` reporting the plan's modelled decode rate beside the host's.
/// Needs the default model (`scripts/fetch-default-model.sh`; `scripts/test.sh` runs it first).
#[test]
fn plan_from_gguf_and_bench_reports_the_modelled_rate() {
    let v: Value = serde_json::from_str(stdout(&anelm(&["plan", "--json"], None)).trim()).expect("json");
    assert_eq!(v["dispatches_per_token"].as_u64(), Some(91), "{v}");
    let planned = v["decode_tok_s"]["1"].as_f64().expect("rate");
    let tiny: Value = serde_json::from_str(stdout(&anelm(&["plan", "--json", "--model", &tiny_qwen35()], None)).trim())
        .expect("json");
    assert_eq!(tiny["dispatches_per_token"].as_u64(), Some(13), "{tiny}");

    let dir = TempDir::new("bench");
    let o = anelm(
        &[
            "bench",
            "--device",
            "ane-emu",
            "-p",
            "0",
            "-n",
            "4",
            "-r",
            "1",
            "--json",
            "--threads",
            "2",
        ],
        Some(&dir.0),
    );
    let row: Value = serde_json::from_str(stdout(&o).trim()).expect("one JSON line");
    assert_eq!(row["backend"], "ane-emu");
    assert_eq!(row["chip"], "m3-max");
    let modelled = row["modelled_ane_tok_s"].as_f64().expect("modelled rate");
    assert!(
        (modelled / planned - 1.0).abs() < 0.01,
        "bench modelled {modelled} vs plan {planned}"
    );
    assert!(row["tok_s_median"].as_f64().expect("host rate") > 0.0);
}
