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
