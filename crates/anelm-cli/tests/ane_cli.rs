//! The ANE commands: `anelm plan` on the committed Qwen3.5-4B / 9B configs against the C++
//! system's measured table and on every architecture, `--chip` validation, `anelm compile` through the compile
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

/// One figure the C++ system measured on an M3 Max and the tolerance the plan must meet.
struct Row {
    model: &'static str,
    weights: &'static str,
    /// `decode_tok_s` key (streams), or `None` for `prefill_tok_s`.
    streams: Option<&'static str>,
    measured: f64,
    tolerance: f64,
}

const fn row(
    model: &'static str,
    weights: &'static str,
    streams: Option<&'static str>,
    measured: f64,
    tolerance: f64,
) -> Row {
    Row {
        model,
        weights,
        streams,
        measured,
        tolerance,
    }
}

/// docs/reference/ane-runtime.md §11 ("Performance facts"), README `7c61e4e`, M3 Max.
const MEASURED: [Row; 9] = [
    // §11 README table: Qwen3.5-4B fp16 generation 9.21 tok/s (single stream).
    row("qwen3_5_4b", "fp16", Some("1"), 9.21, 0.15),
    // §11 README table: Qwen3.5-4B int8 generation 11.66 tok/s (single stream).
    row("qwen3_5_4b", "int8", Some("1"), 11.66, 0.15),
    // §11 README table: Qwen3.5-9B fp16 generation 4.27 tok/s (single stream). Its 536.9 MB LM-head
    // chunks are over the kernel limit, so the C++ system ran its LM head on the CPU.
    row("qwen3_5_9b", "fp16", Some("1"), 4.27, 0.15),
    // §11 README table: Qwen3.5-9B int8 generation 7.01 tok/s (single stream).
    row("qwen3_5_9b", "int8", Some("1"), 7.01, 0.15),
    // §11 serve table: Qwen3.5-4B int8, concurrency 1, 10.53 tok/s aggregate.
    row("qwen3_5_4b", "int8", Some("1"), 10.53, 0.15),
    // §11 serve table: Qwen3.5-4B int8, concurrency 2, 15.95 tok/s aggregate.
    row("qwen3_5_4b", "int8", Some("2"), 15.95, 0.20),
    // §11 serve table: Qwen3.5-4B int8, concurrency 4, 28.62 tok/s aggregate.
    row("qwen3_5_4b", "int8", Some("4"), 28.62, 0.20),
    // §11 README table: Qwen3.5-4B int8 prompt 30.08 tok/s.
    row("qwen3_5_4b", "int8", None, 30.08, 0.25),
    // §11 README table: Qwen3.5-4B fp16 prompt 18.93 tok/s.
    row("qwen3_5_4b", "fp16", None, 18.93, 0.25),
];

fn plan_json(model: &str, weights: &str, extra: &[&str]) -> Value {
    let path = fixture(model);
    let args = [
        &[
            "plan",
            "--model",
            &path,
            "--chip",
            "m3-max",
            "--weights",
            weights,
            "--json",
        ][..],
        extra,
    ]
    .concat();
    serde_json::from_str(stdout(&anelm(&args, None)).trim()).expect("one JSON object")
}

/// `anelm plan --json --runtime ane-cpp` (the code that was measured) against the C++ system's
/// table: prints the table, then asserts every tolerance.
#[test]
fn plan_with_host_work_matches_the_cpp_table() {
    let mut failures = Vec::new();
    println!("| model | weights | figure | modelled | measured | error |\n| --- | --- | --- | ---: | ---: | ---: |");
    for r in &MEASURED {
        let json = plan_json(r.model, r.weights, &["--runtime", "ane-cpp"]);
        assert_eq!(json["runtime"], "ane-cpp");
        let modelled = match r.streams {
            Some(n) => json["decode_tok_s"][n].as_f64(),
            None => json["prefill_tok_s"].as_f64(),
        }
        .expect("rate");
        let off = modelled / r.measured - 1.0;
        let figure = r
            .streams
            .map_or("prefill".to_string(), |n| format!("decode, {n} stream(s)"));
        println!(
            "| {} | {} | {figure} | {modelled:.2} | {:.2} | {:+.1} % |",
            r.model,
            r.weights,
            r.measured,
            off * 100.0
        );
        if off.abs() > r.tolerance {
            failures.push(format!(
                "{} {} {figure}: {modelled:.2} vs {} ({:+.1} %)",
                r.model,
                r.weights,
                r.measured,
                off * 100.0
            ));
        }
    }
    assert!(failures.is_empty(), "outside tolerance: {failures:#?}");
    // The measured figures travel with the plan, and 4B and 9B dispatch counts are the loader's.
    let json = plan_json("qwen3_5_4b", "int8", &[]);
    assert_eq!(json["measured_cpp"]["serve_tok_s"]["4"].as_f64(), Some(28.62));
    assert_eq!(json["dispatches_per_token"].as_u64(), Some(100));
    assert_eq!(json["runtime"], "anelm");
    // 9B fp16: the LM head in 7 chunks that fit the kernel limit (not the C++ system's 4).
    assert_eq!(
        plan_json("qwen3_5_9b", "fp16", &[])["dispatches_per_token"].as_u64(),
        Some(32 * 4 + 7)
    );
    // Host work grows with every stream: four streams are not four times one.
    let (one, four) = (
        json["decode_tok_s"]["1"].as_f64().expect("1"),
        json["decode_tok_s"]["4"].as_f64().expect("4"),
    );
    assert!(four < 3.95 * one && four > one, "{one} → {four}");
    // Issue 38's goal for the runtime's parallel, overlapped host work: ≥ 50 tok/s at 4 streams
    // (the ANE alone bounds it at 59.8); the same runtime with its host work serial stays below.
    assert!(four >= 50.0, "{four}");
    let serial = plan_json("qwen3_5_4b", "int8", &["--serial-host"]);
    let serial_four = serial["decode_tok_s"]["4"].as_f64().expect("4");
    assert!(serial_four < 0.95 * four, "{serial_four} vs {four}");
    let ane_only = json["ane_decode_tok_s"]["4"].as_f64().expect("ane only");
    assert!((ane_only / json["ane_decode_tok_s"]["1"].as_f64().expect("1") - 4.0).abs() < 1e-6);
}

/// `--explain` splits a token's time into the ANE's and the host's terms, in text and in JSON.
#[test]
fn plan_explain_shows_which_terms_dominate() {
    let path = fixture("qwen3_5_4b");
    let text = stdout(&anelm(
        &[
            "plan",
            "--model",
            &path,
            "--chip",
            "m3-max",
            "--weights",
            "int8",
            "--explain",
            "--runtime",
            "ane-cpp",
        ],
        None,
    ));
    for needle in [
        "where a token's time goes (ane-cpp runtime on m3-max, context 256)",
        "decode, 4 streams:",
        "ane streaming",
        "host surfaces",
        "host deltanet",
        "host sampling",
        "prefill, 4 prompt tokens per step",
        "| serve c4 |",
        "why: ",
    ] {
        assert!(text.contains(needle), "missing {needle:?}:\n{text}");
    }
    let json = plan_json("qwen3_5_4b", "int8", &["--explain"]);
    let terms = json["explain"]["decode_4"]["ms_per_token"].as_object().expect("terms");
    let total: f64 = terms.values().map(|v| v.as_f64().expect("ms")).sum();
    let rate = json["decode_tok_s"]["4"].as_f64().expect("rate");
    assert!((1e3 / total / rate - 1.0).abs() < 1e-9, "{total} ms vs {rate} tok/s");
    assert!(terms["host_deltanet"].as_f64().expect("deltanet") > 0.0);
    // A longer context costs more attention.
    let long = plan_json("qwen3_5_4b", "int8", &["--explain", "--context", "8192"]);
    assert!(
        long["explain"]["decode_1"]["ms_per_token"]["host_attention"].as_f64()
            > json["explain"]["decode_1"]["ms_per_token"]["host_attention"].as_f64()
    );
}

/// `anelm plan` for every architecture anelm loads, from the engine's tiny `config.json`s.
#[test]
fn plan_works_for_every_architecture() {
    let hf = |name: &str| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../anelm-engine/tests/fixtures/hf")
            .join(name)
            .display()
            .to_string()
    };
    for (name, per_layer, layers) in [
        ("llama", 3, 2),
        ("qwen3", 3, 2),
        ("qwen3_5", 3, 4),
        ("qwen3_5_text", 3, 4),
        ("gemma3", 4, 4),
    ] {
        let v: Value =
            serde_json::from_str(stdout(&anelm(&["plan", "--model", &hf(name), "--json"], None)).trim()).expect("json");
        let n = v["dispatches_per_token"].as_u64().expect("count");
        assert_eq!(n, per_layer * layers + 1, "{name}: {v}");
        assert!(v["decode_tok_s"]["1"].as_f64().expect("rate") > 0.0, "{name}");
        assert!(v["prefill_tok_s"].as_f64().expect("rate") > 0.0, "{name}");
    }
    let text = stdout(&anelm(&["plan", "--model", &hf("gemma3"), "--chip", "m3-max"], None));
    assert!(
        text.contains("sliding-attention layer") && text.contains("ffn_gate_up"),
        "{text}"
    );
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
    // The emulator's clock is the ANE alone, as the plan's `ane_decode_tok_s` models it.
    let planned = v["ane_decode_tok_s"]["1"].as_f64().expect("rate");
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

/// `ANELM_EMU_REFUSE` makes the emulator refuse the fused FFN (`xnorm`, its input): the model
/// still loads with every FFN in its plain form, and `anelm compile`, `anelm bench` (table and
/// JSON) and the load itself report each fallback with the device's reason. The bench part needs
/// the default model (SmolLM2-135M, 30 layers; `scripts/fetch-default-model.sh`).
#[test]
fn refused_kernel_forms_fall_back_and_are_reported() {
    let dir = TempDir::new("fallback");
    let model = tiny_qwen35();
    let run = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_anelm"));
        c.args(args)
            .env("ANELM_CACHE_DIR", &dir.0)
            .env("ANELM_EMU_REFUSE", "xnorm");
        c.output().expect("run anelm")
    };
    let o = run(&["compile", "--model", &model]);
    let text = stdout(&o);
    let layers = 4; // the tiny Qwen3.5 fixture: 13 programs = 4 × 3 + the LM head
    assert!(text.contains(&format!("{layers} fallback(s)")), "{text}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("ane-emu: {layers} ANE fallback(s)")), "{err}");
    assert!(
        err.contains("ffn resadd → ffn plain") && err.contains("refused-form"),
        "{err}"
    );

    let layers = 30;
    let bench = [
        "bench",
        "--device",
        "ane-emu",
        "-p",
        "0",
        "-n",
        "2",
        "-r",
        "1",
        "--threads",
        "2",
    ];
    let table = stdout(&run(&bench));
    assert!(table.contains(&format!("ane-emu: {layers} ANE fallback(s)")), "{table}");
    assert!(table.contains("ffn resadd → ffn plain"), "{table}");
    let json = stdout(&run(&[&bench[..], &["--json"]].concat()));
    let row: Value = serde_json::from_str(json.lines().next().expect("a row")).expect("json");
    let list = row["ane_fallbacks"].as_array().expect("ane_fallbacks");
    assert_eq!(list.len(), layers, "{row}");
    assert_eq!(list[0]["from"], "ffn resadd");
    assert_eq!(list[0]["to"], "ffn plain");
    assert!(list[0]["reason"].as_str().expect("reason").contains("xnorm"), "{row}");
}

/// A synthetic `anelm doctor --report` file whose sweep lies exactly on `fixed_us + bytes / gb_s`.
fn synthetic_report(dir: &Path, chip: &str, fixed_us: f64, gb_s: f64) -> PathBuf {
    let points: Vec<Value> = [
        (512u64, 540_672u64),
        (1024, 2_228_224),
        (2048, 8_650_752),
        (4096, 33_816_576),
    ]
    .iter()
    .map(|&(size, bytes)| {
        let ms = (fixed_us * 1e-6 + bytes as f64 / (gb_s * 1e9)) * 1e3;
        serde_json::json!({"size": size, "bytes": bytes, "ane_ms": ms, "wall_ms": ms * 1.1})
    })
    .collect();
    let report = serde_json::json!({
        "format": "anelm-doctor-report",
        "version": 1,
        "chip": chip,
        "steps": [],
        "dispatch_sweep": {"device": "ane", "weights": "fp16", "repeats": 10, "points": points},
    });
    let path = dir.join(format!("report-{fixed_us}-{gb_s}.json"));
    std::fs::write(&path, report.to_string()).expect("write report");
    path
}

/// `anelm plan --calibrate REPORT` recovers the report's dispatch line and plans with it: a
/// slower line (more fixed cost, less bandwidth) gives fewer tok/s, a faster one more, on the
/// report's own chip profile.
#[test]
fn plan_calibrate_fits_the_reports_line_and_moves_the_plan() {
    let dir = TempDir::new("calibrate");
    let base = plan_json("qwen3_5_4b", "fp16", &[]);
    let base_rate = base["decode_tok_s"]["1"].as_f64().expect("rate");
    let mut rates = Vec::new();
    for (fixed, gb) in [(300.0, 40.0), (119.0, 109.0), (60.0, 200.0)] {
        let report = synthetic_report(&dir.0, "Apple M3 Max", fixed, gb);
        let report = report.display().to_string();
        let json = plan_json("qwen3_5_4b", "fp16", &["--calibrate", &report]);
        let cal = &json["calibrated"];
        let (f, b) = (
            cal["fixed_us"].as_f64().expect("fixed"),
            cal["gb_s"].as_f64().expect("gb/s"),
        );
        assert!((f / fixed - 1.0).abs() < 1e-6 && (b / gb - 1.0).abs() < 1e-6, "{cal}");
        assert_eq!(json["chip"], "m3-max");
        rates.push(json["decode_tok_s"]["1"].as_f64().expect("rate"));
    }
    // The m3-max profile's own line (119 µs, 109 GB/s) gives the uncalibrated plan back.
    assert!((rates[1] / base_rate - 1.0).abs() < 1e-9, "{rates:?} vs {base_rate}");
    assert!(rates[0] < 0.6 * rates[1] && rates[2] > 1.2 * rates[1], "{rates:?}");
    // Another chip in the report takes that chip's profile (its host constants) as the base.
    let m5 = synthetic_report(&dir.0, "Apple M5", 80.0, 100.0);
    let path = fixture("qwen3_5_4b");
    let text = stdout(&anelm(
        &["plan", "--model", &path, "--calibrate", &m5.display().to_string()],
        None,
    ));
    assert!(
        text.contains("80.0 µs + bytes / 100.0 GB/s per dispatch (sweep on ane") && text.contains("m5 profile"),
        "{text}"
    );
}

/// A report that is not one, or whose sweep cannot be fitted, is a clear error, not a panic.
#[test]
fn plan_calibrate_refuses_a_bad_report() {
    let dir = TempDir::new("badreport");
    let path = fixture("qwen3_5_4b");
    let cases = [
        ("notjson.json", "{", "is not JSON"),
        ("other.json", r#"{"format": "x"}"#, "\"format\" is not"),
        (
            "nosweep.json",
            r#"{"format": "anelm-doctor-report", "version": 1, "dispatch_sweep": null}"#,
            "no \"dispatch_sweep\"",
        ),
        (
            "onepoint.json",
            r#"{"format": "anelm-doctor-report", "version": 1, "dispatch_sweep": {"device": "ane", "points": [{"bytes": 10, "ane_ms": 1.0}]}}"#,
            "distinct sizes",
        ),
    ];
    for (name, text, needle) in cases {
        let report = dir.0.join(name);
        std::fs::write(&report, text).expect("write");
        let o = anelm(
            &["plan", "--model", &path, "--calibrate", &report.display().to_string()],
            None,
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{name} accepted");
        assert!(err.contains(needle) && !err.contains("panicked"), "{name}: {err}");
    }
}

/// Speculative decoding in the plan: with no acceptance it is plain decode (zero drafts), more
/// acceptance never models fewer tokens/s, it drafts where that pays, and a rate outside 0..1
/// is refused.
#[test]
fn plan_models_speculative_decoding_from_an_acceptance_rate() {
    let rate = |json: &Value, key: &str, n: &str| json[key][n].as_f64().unwrap_or_else(|| panic!("{key}[{n}]"));
    let none = plan_json("qwen3_5_4b", "int8", &["--acceptance", "0"]);
    let plain = plan_json("qwen3_5_4b", "int8", &[]);
    assert_eq!(plain["acceptance"].as_f64(), Some(0.74), "the default acceptance");
    for n in ["1", "2", "4", "8"] {
        assert!((rate(&none, "speculative_decode_tok_s", n) - rate(&none, "decode_tok_s", n)).abs() < 1e-9);
        assert_eq!(rate(&none, "speculative_drafts", n), 0.0);
        let mut prev = 0.0;
        for a in ["0", "0.5", "0.74", "0.9"] {
            let json = plan_json("qwen3_5_4b", "int8", &["--acceptance", a]);
            let s = rate(&json, "speculative_decode_tok_s", n);
            assert!(s >= prev, "{n} streams: acceptance {a} models {s} < {prev}");
            prev = s;
        }
    }
    let last = rate(&plain, "speculative_decode_tok_s", "1");
    let one = rate(&plain, "decode_tok_s", "1");
    println!(
        "Qwen3.5-4B int8 on m3-max, 1 stream: {one:.2} tok/s plain, {last:.2} with lookup at 0.74 ({} drafts)",
        rate(&plain, "speculative_drafts", "1")
    );
    assert!(
        last > one,
        "speculation at 0.74 acceptance must pay for a single stream"
    );
    let out = anelm(
        &["plan", "--model", &fixture("qwen3_5_4b"), "--acceptance", "1.5"],
        None,
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("from 0 to 1"));
}
