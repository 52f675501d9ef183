//! The real-Neural-Engine commands where there is none (Linux CI): `anelm doctor` succeeds, says
//! the ANE is unavailable and passes the emulated self-test; `--device ane` fails cleanly.
//! On a Mac these tests check what a Mac prints instead.

use std::process::{Command, Output};

fn anelm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_anelm"))
        .args(args)
        .output()
        .expect("run anelm")
}

const NO_ANE: &str = "no Neural Engine on this machine: use --device cpu or ane-emu";

fn has_ane() -> bool {
    cfg!(target_os = "macos")
        && std::path::Path::new("/System/Library/PrivateFrameworks/AppleNeuralEngine.framework").exists()
}

#[test]
fn doctor_reports_the_machine_and_passes_a_self_test() {
    let o = anelm(&["doctor", "--dispatches", "5"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "doctor failed:\n{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for line in [
        "machine",
        "  os ",
        "  arch ",
        "  cpu ",
        "  cores ",
        "  simd ",
        "  memory ",
        "devices",
        "  cpu      ok",
    ] {
        assert!(out.contains(line), "missing {line:?}:\n{out}");
    }
    assert!(out.contains("self-test passed"), "{out}");
    assert!(!out.contains("FAIL  64"), "{out}");
    if !has_ane() {
        assert!(out.contains(&format!("  ane      unavailable: {NO_ANE}")), "{out}");
        assert!(
            out.contains("running the same self-test on the emulated device"),
            "{out}"
        );
        assert!(out.contains("self-test on ane-emu"), "{out}");
        for s in [
            "compiled",
            "evaluated",
            "matches the CPU",
            "timed: median of 5 dispatches",
        ] {
            for mode in ["fp16", "int8"] {
                let needle = format!("ok    64×64 {mode} {s}");
                assert!(out.contains(&needle), "missing {needle:?}:\n{out}");
            }
        }
    }
}

#[test]
fn device_ane_fails_cleanly_without_one() {
    if has_ane() {
        return;
    }
    for cmd in [
        vec!["generate", "--device", "ane", "-n", "1", "hi"],
        vec![
            "generate",
            "--device",
            "ane",
            "--model",
            "/nonexistent/model.gguf",
            "hi",
        ],
        vec!["bench", "--device", "ane", "-p", "1", "-n", "1", "-r", "1"],
    ] {
        let o = anelm(&cmd);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{cmd:?}: exit code (101 would be a panic): {err}"
        );
        assert!(err.starts_with("error: "), "{cmd:?}: {err}");
        assert!(err.contains(NO_ANE), "{cmd:?}: {err}");
        assert!(!err.contains("panicked"), "{cmd:?}: {err}");
        assert!(o.stdout.is_empty(), "{cmd:?}: nothing generated");
    }
}

#[test]
fn bench_energy_needs_macos_powermetrics() {
    if cfg!(target_os = "macos") {
        return;
    }
    let o = anelm(&["bench", "--energy", "-n", "8"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("needs macOS powermetrics"),
        "{err}"
    );
}

/// `anelm doctor --report FILE` writes the JSON a Mac user sends: the machine, every step with
/// its outcome and time, and the dispatch sweep fitted as fixed + bytes / bandwidth. Without a
/// Neural Engine the ANE's steps say `unavailable` and the sweep runs on the emulator, whose
/// clock (119 µs + bytes / 78 GB/s on m3-max) the fit recovers.
#[test]
fn doctor_report_writes_the_json_a_mac_user_sends() {
    let path = std::env::temp_dir().join(format!("anelm-doctor-report-{}.json", std::process::id()));
    let o = anelm(&["doctor", "--dispatches", "3", "--report", &path.display().to_string()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("report written to"), "{out}");
    let text = std::fs::read_to_string(&path).expect("report");
    let _ = std::fs::remove_file(&path);
    let r: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(r["format"], "anelm-doctor-report");
    assert_eq!(r["version"], 1);
    for key in ["os", "arch", "cpu", "cores", "memory"] {
        assert!(r["machine"][key].is_string(), "machine.{key}: {text}");
    }
    let steps = r["steps"].as_array().expect("steps");
    assert!(
        steps.iter().all(|s| s["ms"].as_f64().is_some_and(|m| m >= 0.0)),
        "{text}"
    );
    assert!(
        steps
            .iter()
            .any(|s| s["step"] == "64×64 fp16 compiled" && s["outcome"] == "ok"),
        "{text}"
    );
    let sweep = &r["dispatch_sweep"];
    assert_eq!(sweep["points"].as_array().map(Vec::len), Some(4), "{text}");
    if !has_ane() {
        assert_eq!(r["ane"]["available"], false);
        assert!(r["identifier_bytes"].is_null());
        let open = steps.iter().find(|s| s["step"] == "open").expect("open step");
        assert_eq!(
            (open["device"].as_str(), open["outcome"].as_str()),
            (Some("ane"), Some("unavailable"))
        );
        assert!(steps.iter().any(|s| s["device"] == "ane-emu"), "{text}");
        assert_eq!(sweep["device"], "ane-emu");
        let fixed = sweep["fit"]["fixed_us"].as_f64().expect("fit");
        let gb = sweep["fit"]["gb_s"].as_f64().expect("fit");
        assert!(
            (fixed - 119.0).abs() < 0.5 && (gb / 78.0 - 1.0).abs() < 0.01,
            "{}",
            sweep["fit"]
        );
    } else {
        assert_eq!(sweep["device"], "ane");
    }
}
