//! The emulated schedule of a decode step beside the plan's (issue 38): the fixtures run on the
//! emulated Neural Engine with 1, 2, 4 and 8 streams in one step's lanes; the emulator's
//! schedule puts this machine's measured host work between the programs' modelled times.
//!
//! Asserted: the plan dispatches exactly what the runtime dispatches per step, its ANE time per
//! step is the emulator's within 10 %, and extra lanes cost the modelled device nothing. Printed (not asserted: the host side is this shared
//! machine's real time, not a Mac's): the schedule's tokens/s with the host work on one kernel
//! thread (serial; measured in a child process of this test, as the kernel pool is sized once
//! per process) and on two (parallel sections, overlapped LM head), beside the plan's figures for
//! the same model with the M3 Max host profile, serial and overlapped.

use std::path::PathBuf;
use std::sync::Arc;

use anelm_ane::{ChipProfile, EmuAne, HostOptions, PlanOptions, WeightMode, plan_model};
use anelm_engine::plan_dims::model_kernels;
use anelm_engine::{AneBackend, AneOptions, LanguageModel, Session, load_model_weights};

mod common;

const STEPS: usize = 4;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

/// One row of the table: what the emulated schedule measured per step.
struct Emulated {
    dispatches: f64,
    ane_ms: f64,
    host_ms: f64,
    schedule_ms: f64,
}

fn emulate(model: &dyn LanguageModel, ane: &EmuAne, streams: usize) -> Emulated {
    let vocab = model.info().vocab_size as u32;
    let mut sessions: Vec<Session> = (0..streams).map(|_| model.new_session(128)).collect();
    for (i, s) in sessions.iter_mut().enumerate() {
        let prompt: Vec<u32> = (0..5 + i as u32).map(|t| (t * 7 + i as u32 * 3 + 1) % vocab).collect();
        common::forward_last(model, std::slice::from_mut(s), &[prompt]);
    }
    ane.reset_clock();
    for step in 0..STEPS as u32 {
        let next: Vec<Vec<u32>> = (0..streams as u32)
            .map(|i| vec![(step * 11 + i * 5 + 2) % vocab])
            .collect();
        common::forward_last(model, &mut sessions, &next);
    }
    let s = ane.stats();
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e3 / STEPS as f64;
    Emulated {
        dispatches: s.dispatches as f64 / STEPS as f64,
        ane_ms: per(s.ane_time),
        host_ms: per(s.host_critical_time),
        schedule_ms: per(s.schedule_time()),
    }
}

/// Set in the child process that measures the schedule with one kernel thread.
const SERIAL_CHILD: &str = "ANELM_HOST_SCHEDULE_SERIAL";
const TEST_NAME: &str = "the_emulated_schedule_dispatches_what_the_plan_models";

/// The emulated tok/s per (fixture, streams) with the host work on one kernel thread: this test
/// run again in a child process whose kernel pool has one thread, its `serial` lines parsed.
fn serial_schedule() -> Vec<(String, usize, f64)> {
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new(exe)
        .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(SERIAL_CHILD, "1")
        .output()
        .expect("run the serial child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the serial child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| {
            // libtest may print the test's name on the first line's start.
            let mut w = l[l.find("serial ")? + "serial ".len()..].split(' ');
            Some((w.next()?.to_string(), w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
}

#[test]
fn the_emulated_schedule_dispatches_what_the_plan_models() {
    let child = std::env::var_os(SERIAL_CHILD).is_some();
    anelm_kernels::pool::init_global(if child { 1 } else { 2 });
    let serial_emulated = if child { Vec::new() } else { serial_schedule() };
    let chip = ChipProfile::m3_max();
    if !child {
        println!(
            "| fixture | streams | dispatches/step emu = plan | ANE ms/step emu · plan | host ms/step (this machine, 2 threads) | \
             emulated tok/s (1 thread · 2 threads) | plan tok/s (M3 Max host, serial · overlapped) |\n\
             | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
    }
    for name in ["llama", "gemma3", "qwen3_5"] {
        let path = fixture(name);
        let ane = Arc::new(EmuAne::for_chip(chip));
        let backend = AneBackend::new(
            ane.clone(),
            AneOptions {
                weights: WeightMode::Fp16,
                ..AneOptions::default()
            },
        );
        let model = load_model_weights(&path, &backend, &mut |_, _| {}).expect("load the fixture on ane-emu");
        let kernels = model_kernels(&path).expect("the fixture's kernels");
        let plan = plan_model(&kernels, &PlanOptions::with_weights(WeightMode::Fp16)).expect("plan");
        let plan_ane_ms = plan.step_seconds(&chip) * 1e3;
        let overlapped = HostOptions::default();
        let serial = HostOptions {
            serial: true,
            ..HostOptions::default()
        };
        let mut ane_per_step = Vec::new();
        for streams in [1usize, 2, 4, 8] {
            let e = emulate(model.as_ref(), &ane, streams);
            let tok_s = streams as f64 / e.schedule_ms * 1e3;
            if child {
                println!("serial {name} {streams} {tok_s}");
            } else {
                let one_thread = serial_emulated
                    .iter()
                    .find(|(n, s, _)| n == name && *s == streams)
                    .map(|r| r.2)
                    .expect("the serial child measured every row");
                println!(
                    "| {name} | {streams} | {:.0} = {} | {:.3} · {:.3} | {:.3} | {one_thread:.1} · {tok_s:.1} | {:.1} · {:.1} |",
                    e.dispatches,
                    plan.dispatches_per_token(),
                    e.ane_ms,
                    plan_ane_ms,
                    e.host_ms,
                    plan.decode_tok_s(&chip, &serial, streams),
                    plan.decode_tok_s(&chip, &overlapped, streams),
                );
            }
            assert_eq!(
                e.dispatches,
                plan.dispatches_per_token() as f64,
                "{name}, {streams} streams: the plan's dispatches per step are not the runtime's"
            );
            assert!(
                (e.ane_ms / plan_ane_ms - 1.0).abs() < 0.10,
                "{name}, {streams} streams: emulated ANE {:.3} ms per step, planned {plan_ane_ms:.3}",
                e.ane_ms
            );
            ane_per_step.push(e.ane_ms);
        }
        // Extra lanes ride along: eight streams' step costs the modelled device what one costs.
        assert!(
            (ane_per_step[3] / ane_per_step[0] - 1.0).abs() < 1e-6,
            "{name}: {ane_per_step:?}"
        );
    }
}
