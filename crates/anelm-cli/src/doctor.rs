//! `anelm doctor`: what this machine is, which devices open, and a self-test of the Neural
//! Engine path — on the real ANE when it opens, else on the emulated one. Each step prints `ok`
//! or its exact failure, so the output is what a user pastes into a bug report.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::Args;

use anelm_ane::apple::{AppleAne, ProbeStep, framework_version, macos_version};
use anelm_ane::{
    AneDevice, AneKernel, DEVICE_SWEEP_SIZES, DispatchFit, EMULATOR_SWEEP_SIZES, EmuAne, EmuConfig, Surface,
    WeightMode, dispatch_sweep, lower,
};
use anelm_engine::{AneBackend, AneOptions, Backend, Batch, CpuBackend, Kernel, KernelSpec, WeightId};
use anelm_model::tensor_store::TensorStore;

use crate::doctor_report::{Console, MachineFacts, Outcome, SweepRecord, report_json, write_report};

/// Arguments of `anelm doctor`.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Dispatches timed per self-test kernel (the median is reported).
    #[arg(long, default_value_t = 100)]
    pub dispatches: usize,
    /// Also run the self-test on the emulated ANE when the real one opens.
    #[arg(long)]
    pub emulated: bool,
    /// Also time a dispatch sweep and write everything as JSON to this file (the report to send
    /// with an issue; `anelm plan --calibrate FILE` plans with its sweep).
    #[arg(long, value_name = "FILE")]
    pub report: Option<std::path::PathBuf>,
}

/// Rows and columns of the self-test kernel.
const N: usize = 64;

/// Largest error allowed against the f32 CPU result, relative to the largest |y|: fp16 weights
/// and activations (11-bit mantissas, fp16 accumulation on the ANE) stay well inside 1%; int8
/// rows add up to 1/254 of each row's largest weight.
fn tolerance(mode: WeightMode) -> f32 {
    match mode {
        WeightMode::Fp16 => 1e-2,
        WeightMode::Int8 { .. } => 3e-2,
    }
}

/// Run `anelm doctor`.
pub fn run(a: DoctorArgs) -> Result<()> {
    if a.dispatches == 0 {
        bail!("--dispatches must be at least 1");
    }
    let mut out = Console::new(std::io::stdout().lock());
    writeln!(
        out,
        "anelm doctor (anelm {}) — paste all of this into a bug report",
        env!("CARGO_PKG_VERSION")
    )?;
    writeln!(out)?;
    writeln!(out, "machine")?;
    let machine = machine();
    for (k, v) in &machine {
        writeln!(out, "  {k:<8} {v}")?;
    }
    writeln!(out)?;
    writeln!(out, "devices")?;
    writeln!(
        out,
        "  cpu      ok (kernels: {}, {} threads)",
        anelm_kernels::Isa::best().name(),
        rayon::current_num_threads()
    )?;
    writeln!(
        out,
        "  ane-emu  ok (emulated Neural Engine, chip profile m3-max by default)"
    )?;
    let ane = AppleAne::open().map(Arc::new);
    out.section("ane");
    match &ane {
        Ok(_) => {
            writeln!(out, "  ane      ok (AppleNeuralEngine.framework)")?;
            out.record("open", Outcome::Ok, "AppleNeuralEngine.framework");
        }
        Err(e) => {
            writeln!(out, "  ane      unavailable: {e}")?;
            out.record("open", Outcome::Unavailable, &e.to_string());
        }
    }
    for s in AppleAne::probe() {
        writeln!(out, "           {}", probe_line(&s))?;
        let (outcome, detail) = match (&s.result, &ane) {
            (Ok(d), _) => (Outcome::Ok, d.clone()),
            (Err(e), Ok(_)) => (Outcome::Fail, e.clone()),
            (Err(e), Err(_)) => (Outcome::Unavailable, e.clone()),
        };
        out.record(&format!("probe: {}", s.what), outcome, &detail);
    }
    out.flush()?;
    let mut passed = true;
    match &ane {
        Ok(dev) => {
            passed &= self_test(&mut out, dev.as_ref(), a.dispatches)?;
            passed &= fallback_test(&mut out, Arc::clone(dev))?;
            if a.emulated {
                passed &= self_test(&mut out, &EmuAne::default(), a.dispatches)?;
                passed &= fallback_test(&mut out, Arc::new(emulator()))?;
            }
        }
        Err(_) => {
            writeln!(out)?;
            writeln!(
                out,
                "the Neural Engine is unavailable here; running the same self-test on the emulated device"
            )?;
            passed &= self_test(&mut out, &EmuAne::default(), a.dispatches)?;
            passed &= fallback_test(&mut out, Arc::new(emulator()))?;
        }
    }
    if let Some(path) = &a.report {
        let sweep = match &ane {
            Ok(dev) => sweep(&mut out, dev.as_ref(), &DEVICE_SWEEP_SIZES, a.dispatches)?,
            Err(_) => sweep(&mut out, &EmuAne::default(), &EMULATOR_SWEEP_SIZES, a.dispatches)?,
        };
        let facts = MachineFacts {
            chip: machine.iter().find(|(k, _)| *k == "cpu").map(|(_, v)| v.clone()),
            macos: macos_version(),
            framework: framework_version(),
            ane_unavailable: ane.as_ref().err().map(|e| e.to_string()),
            identifier_bytes: ane.as_ref().ok().map(|d| d.stats().identifier_bytes).filter(|&n| n > 0),
            machine,
        };
        write_report(path, &report_json(&facts, &out.steps, Some(&sweep)))?;
        writeln!(out)?;
        writeln!(
            out,
            "report written to {} — please attach it to an issue (see the README)",
            path.display()
        )?;
    }
    writeln!(out)?;
    if !passed {
        bail!("self-test failed (see the FAIL lines above)");
    }
    writeln!(out, "self-test passed")?;
    Ok(())
}

/// The dispatch sweep of the report on `dev`: one fp16 linear kernel per size, `repeats` timed
/// dispatches each, and the line fitted through the medians. Printed and returned; a failure is
/// recorded in the report, not fatal.
fn sweep(out: &mut Console<impl Write>, dev: &dyn AneDevice, sizes: &[usize], repeats: usize) -> Result<SweepRecord> {
    writeln!(out)?;
    writeln!(out, "dispatch sweep on {} (fp16 linear kernels)", dev.name())?;
    out.section(dev.name());
    let points = dispatch_sweep(dev, sizes, repeats).map_err(|e| e.to_string());
    match &points {
        Ok(pts) => {
            for p in pts {
                writeln!(
                    out,
                    "  {:>5}×{:<5} {:>10.3} MB  ane {:.3} ms  wall {:.3} ms  runtime path {:.3} ms (+{:.1} µs outside the device)",
                    p.size,
                    p.size,
                    p.bytes as f64 / 1e6,
                    p.ane_seconds * 1e3,
                    p.wall_seconds * 1e3,
                    p.run_seconds * 1e3,
                    p.runtime_us()
                )?;
            }
            let fit = DispatchFit::of_sweep(pts)
                .map(|f| {
                    (
                        (),
                        format!(
                            "{:.1} µs + bytes / {:.1} GB/s (largest residual {:.1} %)",
                            f.fixed_us,
                            f.gb_s,
                            f.max_residual * 100.0
                        ),
                    )
                })
                .map_err(|e| e.to_string());
            step(out, "dispatch line fitted", fit)?;
            // The emulator's wall time is its own arithmetic, so only a real device says what
            // the host spends per dispatch.
            if dev.name() != "ane-emu"
                && let Some(p) = pts.first()
            {
                writeln!(
                    out,
                    "  host per dispatch beyond the ANE's own time: {:.1} µs at {}×{} (anelm plan assumes {:.0} µs \
                     plus the surfaces' copies)",
                    p.host_per_dispatch_us(),
                    p.size,
                    p.size,
                    anelm_ane::ChipProfile::m3_max().host.reused_dispatch_us
                )?;
            }
        }
        Err(e) => {
            step::<()>(out, "dispatch sweep", Err(e.clone()))?;
        }
    }
    Ok(SweepRecord {
        device: dev.name().to_string(),
        repeats,
        points,
    })
}

/// The emulator for the fallback check: it refuses the forms `ANELM_EMU_REFUSE` names (a test
/// knob; by default nothing).
fn emulator() -> EmuAne {
    EmuAne::new(EmuConfig {
        refuse: EmuConfig::refuse_from_env(),
        ..EmuConfig::default()
    })
}

/// Widths of the fallback check's model: hidden, FFN and vocabulary.
const FB_HIDDEN: usize = 64;
const FB_INTER: usize = 128;
const FB_VOCAB: usize = 256;
/// Lanes of the fallback check's batch.
const FB_LANES: usize = 4;

/// A few f32 matrices in memory (the fallback check's model).
struct MemStore(Vec<(String, Vec<usize>, Vec<u8>)>);

impl MemStore {
    fn fallback_model() -> MemStore {
        let m = |name: &str, rows: usize, cols: usize, seed: usize| {
            let data: Vec<u8> = (0..rows * cols)
                .map(|i| ((i * 7 + seed * 13) % 17) as f32 / 64.0 - 0.125)
                .flat_map(f32::to_le_bytes)
                .collect();
            (name.to_string(), vec![rows, cols], data)
        };
        MemStore(vec![
            m("gate", FB_INTER, FB_HIDDEN, 1),
            m("up", FB_INTER, FB_HIDDEN, 2),
            m("down", FB_HIDDEN, FB_INTER, 3),
            m("head", FB_VOCAB, FB_HIDDEN, 4),
        ])
    }
}

impl TensorStore for MemStore {
    fn tensor(
        &self,
        name: &str,
    ) -> std::result::Result<anelm_model::tensor_store::TensorView<'_>, anelm_model::error::ModelError> {
        let (n, shape, data) = self
            .0
            .iter()
            .find(|(n, _, _)| n == name)
            .ok_or_else(|| anelm_model::error::ModelError::MissingTensor { name: name.to_string() })?;
        Ok(anelm_model::tensor_store::TensorView {
            name: n,
            format: anelm_kernels::WeightFormat::F32,
            shape: shape.clone(),
            data,
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.0.iter().any(|(n, _, _)| n == name)
    }

    fn tensor_names(&self) -> Vec<&str> {
        self.0.iter().map(|(n, _, _)| n.as_str()).collect()
    }
}

/// The fallback chain on `dev` (issue 27 item 4): an int8 SwiGLU FFN with its residual add and an
/// int8 LM head compiled through the ANE backend, which falls back per kernel (int8 → fp16; FFN
/// resadd → plain → chunked; LM head → CPU) when the device refuses a form. Prints each fallback
/// with the device's reason, and checks both kernels against the CPU backend. Fallbacks are not
/// failures; a kernel that cannot be built at all, or computes something else, is.
fn fallback_test<D: AneDevice + 'static>(out: &mut Console<impl Write>, dev: Arc<D>) -> Result<bool> {
    writeln!(out)?;
    writeln!(
        out,
        "fallback chain on {} (int8 FFN with residual, int8 LM head)",
        dev.name()
    )?;
    out.section(dev.name());
    let store: Arc<dyn TensorStore> = Arc::new(MemStore::fallback_model());
    let backend = AneBackend::new(
        Arc::clone(&dev),
        AneOptions {
            weights: WeightMode::INT8_PER_ROW,
            ..AneOptions::default()
        },
    );
    let id = WeightId::new;
    let specs = [
        (
            "ffn",
            KernelSpec::SwiGluResidual {
                gate: id("gate"),
                up: id("up"),
                down: id("down"),
            },
        ),
        ("lm_head", KernelSpec::LmHead { w: id("head") }),
    ];
    let x: Vec<f32> = (0..FB_LANES * FB_HIDDEN)
        .map(|i| ((i * 5) % 13) as f32 / 8.0 - 0.75)
        .collect();
    let r: Vec<f32> = (0..FB_LANES * FB_HIDDEN)
        .map(|i| ((i * 3) % 7) as f32 / 4.0 - 0.75)
        .collect();
    let (Some(x), Some(r)) = (
        Batch::from_vec(FB_LANES, FB_HIDDEN, x),
        Batch::from_vec(FB_LANES, FB_HIDDEN, r),
    ) else {
        bail!("internal error: the fallback check's batches have the wrong size");
    };
    let mut all = true;
    for (what, spec) in &specs {
        let built = backend.compile(spec, &store).map_err(|e| e.to_string());
        let Some(kernel) = step(out, &format!("{what} built"), built.map(|k| (k, String::new())))? else {
            all = false;
            continue;
        };
        let cpu = CpuBackend::new().compile(spec, &store)?;
        let inputs: Vec<&Batch> = if spec.has_residual() { vec![&x, &r] } else { vec![&x] };
        let run = |k: &dyn Kernel| -> std::result::Result<Vec<Vec<f32>>, String> {
            let mut y = Batch::default();
            k.run(&inputs, &mut y).map_err(|e| e.to_string())?;
            Ok((0..FB_LANES).map(|l| y.lane(l).to_vec()).collect())
        };
        let cmp = run(kernel.as_ref()).and_then(|got| {
            let want = run(cpu.as_ref())?;
            let err = relative_error(&got, &want);
            let tol = tolerance(WeightMode::INT8_PER_ROW);
            if err <= tol {
                Ok(((), format!("max error {err:.2e} of max |y| (limit {tol:.0e})")))
            } else {
                Err(format!("max error {err:.2e} of max |y| exceeds {tol:.0e}"))
            }
        });
        all &= step(out, &format!("{what} matches the CPU"), cmp)?.is_some();
    }
    let list = backend.monitor().fallbacks();
    if list.is_empty() {
        writeln!(out, "  ok    no fallbacks: every kernel got its first form")?;
    } else {
        writeln!(out, "  {} fallback(s):", list.len())?;
        for f in &list {
            writeln!(out, "        {f}")?;
        }
    }
    out.flush()?;
    Ok(all)
}

fn probe_line(s: &ProbeStep) -> String {
    match &s.result {
        Ok(d) => format!("ok    {}: {d}", s.what),
        Err(e) => format!("FAIL  {}: {e}", s.what),
    }
}

/// Print one step's outcome and return whether it passed.
fn step<T>(out: &mut Console<impl Write>, what: &str, r: Result<(T, String), String>) -> Result<Option<T>> {
    match r {
        Ok((t, detail)) => {
            out.record(what, Outcome::Ok, &detail);
            writeln!(
                out,
                "  ok    {what}{}",
                if detail.is_empty() {
                    String::new()
                } else {
                    format!(": {detail}")
                }
            )?;
            out.flush()?;
            Ok(Some(t))
        }
        Err(e) => {
            out.record(what, Outcome::Fail, &e);
            writeln!(out, "  FAIL  {what}: {e}")?;
            out.flush()?;
            Ok(None)
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// Deterministic test weights (`N × N`, row-major) and 32 lanes of inputs.
fn test_data() -> (Vec<f32>, Vec<Vec<f32>>) {
    let w = (0..N * N)
        .map(|i| (((i / N) * 7 + (i % N) * 13) % 17) as f32 / 30.0 - 0.27)
        .collect();
    let x = (0..anelm_ane::LANES)
        .map(|lane| (0..N).map(|c| ((lane * 5 + c * 3) % 11) as f32 / 8.0 - 0.625).collect())
        .collect();
    (w, x)
}

/// y = W·x on the CPU in f32.
fn reference(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks_exact(N)
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

/// Largest |got − want| over all lanes, relative to the largest |want|.
pub(crate) fn relative_error(got: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
    let scale = want
        .iter()
        .flatten()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    let err = got
        .iter()
        .zip(want)
        .flat_map(|(g, w)| g.iter().zip(w).map(|(a, b)| (a - b).abs()))
        .fold(0f32, |m, e| if e.is_nan() { f32::INFINITY } else { m.max(e) });
    if got.len() != want.len() || got.iter().zip(want).any(|(g, w)| g.len() != w.len()) {
        return f32::INFINITY;
    }
    err / scale
}

/// The median of some durations (`Duration::ZERO` for none).
pub(crate) fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    match v.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

/// compile → load → evaluate → compare with the CPU → time → unload, for a 64×64 fp16 kernel
/// and the same with int8 weights. Returns whether every step passed.
fn self_test(out: &mut Console<impl Write>, dev: &dyn AneDevice, dispatches: usize) -> Result<bool> {
    writeln!(out)?;
    writeln!(out, "self-test on {}", dev.name())?;
    out.section(dev.name());
    let (w, x) = test_data();
    let want: Vec<Vec<f32>> = x.iter().map(|v| reference(&w, v)).collect();
    let mut all = true;
    for mode in [WeightMode::Fp16, WeightMode::INT8_PER_ROW] {
        let label = format!("{N}×{N} {}", mode.label());
        all &= one_kernel(out, dev, &label, mode, &w, &x, &want, dispatches)?;
    }
    Ok(all)
}

#[allow(clippy::too_many_arguments)]
fn one_kernel(
    out: &mut Console<impl Write>,
    dev: &dyn AneDevice,
    label: &str,
    mode: WeightMode,
    w: &[f32],
    x: &[Vec<f32>],
    want: &[Vec<f32>],
    dispatches: usize,
) -> Result<bool> {
    let kernel = AneKernel::Linear { rows: N, cols: N };
    let lowered = lower(&kernel, &[w], mode).map_err(|e| e.to_string());
    let Some(low) = step(
        out,
        &format!("{label} lowered to MIL"),
        lowered.map(|l| {
            let d = format!(
                "{} weight bytes in {} file(s)",
                l.weights.total_bytes(),
                l.weights.len()
            );
            (l, d)
        }),
    )?
    else {
        return Ok(false);
    };
    let text = low.mil_text();
    let t = Instant::now();
    let compiled = dev.compile(&text, &low.weights).map(|h| (h, ms(t.elapsed())));
    let Some(h) = step(out, &format!("{label} compiled"), compiled.map_err(|e| e.to_string()))? else {
        return Ok(false);
    };
    // From here the program is released on every path: load, evaluation or comparison failed or not.
    let result = load_run_unload(out, dev, h, label, mode, x, want, dispatches);
    let _ = dev.release(h);
    result
}

/// load → evaluate and time → unload of a compiled self-test program (the caller releases it).
#[allow(clippy::too_many_arguments)]
fn load_run_unload(
    out: &mut Console<impl Write>,
    dev: &dyn AneDevice,
    h: anelm_ane::ProgramHandle,
    label: &str,
    mode: WeightMode,
    x: &[Vec<f32>],
    want: &[Vec<f32>],
    dispatches: usize,
) -> Result<bool> {
    let t = Instant::now();
    let loaded = dev.load(h).map(|()| ((), ms(t.elapsed())));
    if step(out, &format!("{label} loaded"), loaded.map_err(|e| e.to_string()))?.is_none() {
        return Ok(false);
    }
    let passed = evaluate_and_time(out, dev, h, label, mode, x, want, dispatches)?;
    let unloaded = dev.unload(h).map(|()| ((), String::new()));
    let unloaded_ok = step(out, &format!("{label} unloaded"), unloaded.map_err(|e| e.to_string()))?.is_some();
    Ok(passed && unloaded_ok)
}

#[allow(clippy::too_many_arguments)]
fn evaluate_and_time(
    out: &mut Console<impl Write>,
    dev: &dyn AneDevice,
    h: anelm_ane::ProgramHandle,
    label: &str,
    mode: WeightMode,
    x: &[Vec<f32>],
    want: &[Vec<f32>],
    dispatches: usize,
) -> Result<bool> {
    let lanes: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
    let input = match Surface::pack(N, &lanes) {
        Ok(s) => s,
        Err(e) => return Ok(step::<()>(out, &format!("{label} evaluated"), Err(e.to_string()))?.is_some()),
    };
    let mut outputs = match dev.signature(h) {
        Ok(sig) => sig.output_surfaces(),
        Err(e) => return Ok(step::<()>(out, &format!("{label} evaluated"), Err(e.to_string()))?.is_some()),
    };
    let first = dev
        .evaluate(h, &[&input], &mut outputs)
        .map_err(|e| e.to_string())
        .and_then(|t| {
            let got = outputs
                .first()
                .ok_or("the program has no output".to_string())?
                .unpack(x.len())
                .map_err(|e| e.to_string())?;
            Ok((got, format!("32 lanes, {}", ms(t.host))))
        });
    let Some(got) = step(out, &format!("{label} evaluated"), first)? else {
        return Ok(false);
    };
    let err = relative_error(&got, want);
    let tol = tolerance(mode);
    let cmp = if err <= tol {
        Ok(((), format!("max error {err:.2e} of max |y| (limit {tol:.0e})")))
    } else {
        Err(format!(
            "max error {err:.2e} of max |y| exceeds {tol:.0e}: the device computes something else"
        ))
    };
    let cmp_ok = step(out, &format!("{label} matches the CPU"), cmp)?.is_some();
    let mut host = Vec::with_capacity(dispatches);
    let mut ane = Vec::with_capacity(dispatches);
    let mut failure = None;
    for _ in 0..dispatches {
        match dev.evaluate(h, &[&input], &mut outputs) {
            Ok(t) => {
                host.push(t.host);
                ane.push(t.ane);
            }
            Err(e) => {
                failure = Some(e.to_string());
                break;
            }
        }
    }
    let timed = match failure {
        Some(e) => Err(format!("dispatch {} of {dispatches}: {e}", host.len() + 1)),
        None => Ok((
            (),
            format!(
                "median of {dispatches} dispatches: {} wall, {} ANE{}",
                ms(median(host)),
                ms(median(ane)),
                if dev.name() == "ane-emu" { " (modelled)" } else { "" }
            ),
        )),
    };
    let timed_ok = step(out, &format!("{label} timed"), timed)?.is_some();
    Ok(cmp_ok && timed_ok)
}

/// `(name, value)` lines describing this machine.
fn machine() -> Vec<(&'static str, String)> {
    let os = if cfg!(target_os = "macos") {
        macos_version().unwrap_or_else(|| "macOS (version unknown)".into())
    } else {
        let pretty = std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|t| os_release_name(&t));
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        match pretty {
            Some(p) => format!("{} ({p}, kernel {kernel})", std::env::consts::OS),
            None => std::env::consts::OS.to_string(),
        }
    };
    let cpu = if cfg!(target_os = "macos") {
        sysctl("machdep.cpu.brand_string")
    } else {
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| cpuinfo_model(&t))
    }
    .unwrap_or_else(|| "unknown".into());
    let logical = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cores = match (sysctl("hw.perflevel0.physicalcpu"), sysctl("hw.perflevel1.physicalcpu")) {
        (Some(p), Some(e)) => format!("{logical} logical ({p} performance + {e} efficiency)"),
        _ => format!("{logical} logical"),
    };
    let memory = if cfg!(target_os = "macos") {
        sysctl("hw.memsize").and_then(|s| s.parse::<u64>().ok())
    } else {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| meminfo_total(&t))
    }
    .map_or_else(
        || "unknown".into(),
        |b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
    );
    vec![
        ("os", os),
        ("arch", std::env::consts::ARCH.to_string()),
        ("cpu", cpu),
        ("cores", cores),
        ("simd", simd_features()),
        ("memory", memory),
    ]
}

/// `sysctl -n <name>` (macOS; `None` elsewhere or on failure).
fn sysctl(name: &str) -> Option<String> {
    if !cfg!(target_os = "macos") {
        return None;
    }
    let out = std::process::Command::new("/usr/sbin/sysctl")
        .args(["-n", name])
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

/// `PRETTY_NAME` of an os-release file.
pub(crate) fn os_release_name(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').to_string())
        .filter(|v| !v.is_empty())
}

/// The first `model name` of /proc/cpuinfo.
pub(crate) fn cpuinfo_model(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "model name").then(|| v.trim().to_string())
    })
}

/// `MemTotal` of /proc/meminfo, in bytes.
pub(crate) fn meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// SIMD features the CPU reports, the kernel path anelm picks, and any A/B switch set.
fn simd_features() -> String {
    let v: Vec<&str> = anelm_kernels::Features::get()
        .list()
        .into_iter()
        .filter_map(|(name, on)| on.then_some(name))
        .collect();
    let list = if v.is_empty() {
        "none detected".to_string()
    } else {
        v.join(" ")
    };
    let switches = anelm_kernels::Tuning::get().changed();
    let switches = if switches.is_empty() {
        String::new()
    } else {
        format!("; switches set: {}", switches.join(" "))
    };
    format!("{list} (kernels use {}{switches})", anelm_kernels::Isa::best().name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_linux_system_files() {
        let osr = "NAME=\"Ubuntu\"\nPRETTY_NAME=\"Ubuntu 24.04.1 LTS\"\nID=ubuntu\n";
        assert_eq!(os_release_name(osr).as_deref(), Some("Ubuntu 24.04.1 LTS"));
        assert_eq!(os_release_name("ID=x\n"), None);
        let cpu = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu\n";
        assert_eq!(cpuinfo_model(cpu).as_deref(), Some("AMD EPYC 7B13"));
        assert_eq!(cpuinfo_model("processor : 0\n"), None);
        let mem = "MemTotal:        8123456 kB\nMemFree:  1 kB\n";
        assert_eq!(meminfo_total(mem), Some(8_123_456 * 1024));
        assert_eq!(meminfo_total("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn error_and_median() {
        let want = vec![vec![1.0, -2.0], vec![4.0, 0.0]];
        assert_eq!(relative_error(&want, &want), 0.0);
        let got = vec![vec![1.0, -2.0], vec![4.0, 0.4]];
        assert!((relative_error(&got, &want) - 0.1).abs() < 1e-6);
        assert_eq!(
            relative_error(&[vec![f32::NAN, 0.0], vec![0.0, 0.0]], &want),
            f32::INFINITY
        );
        assert_eq!(relative_error(&want[..1], &want), f32::INFINITY);
        let ms = |n| Duration::from_millis(n);
        assert_eq!(median(vec![ms(3), ms(1), ms(2)]), ms(2));
        assert_eq!(median(vec![ms(4), ms(1), ms(2), ms(3)]), Duration::from_micros(2500));
        assert_eq!(median(vec![]), Duration::ZERO);
    }

    /// The emulator with its outputs zeroed: a device that runs but computes the wrong thing.
    struct Broken(EmuAne);

    impl AneDevice for Broken {
        fn name(&self) -> &str {
            "broken"
        }
        fn compile(
            &self,
            mil: &str,
            w: &anelm_mil::WeightFiles,
        ) -> Result<anelm_ane::ProgramHandle, anelm_ane::AneError> {
            self.0.compile(mil, w)
        }
        fn load(&self, h: anelm_ane::ProgramHandle) -> Result<(), anelm_ane::AneError> {
            self.0.load(h)
        }
        fn evaluate(
            &self,
            h: anelm_ane::ProgramHandle,
            i: &[&Surface],
            o: &mut [Surface],
        ) -> Result<anelm_ane::DispatchTime, anelm_ane::AneError> {
            let t = self.0.evaluate(h, i, o)?;
            for s in o.iter_mut() {
                *s = Surface::with_lanes(s.channels(), s.lanes());
            }
            Ok(t)
        }
        fn unload(&self, h: anelm_ane::ProgramHandle) -> Result<(), anelm_ane::AneError> {
            self.0.unload(h)
        }
        fn release(&self, h: anelm_ane::ProgramHandle) -> Result<(), anelm_ane::AneError> {
            self.0.release(h)
        }
        fn signature(&self, h: anelm_ane::ProgramHandle) -> Result<anelm_ane::Signature, anelm_ane::AneError> {
            self.0.signature(h)
        }
    }

    /// The emulator failing every load: a self-test that stops after its compile step.
    struct NoLoad(EmuAne);

    impl AneDevice for NoLoad {
        fn name(&self) -> &str {
            "no-load"
        }
        fn compile(
            &self,
            mil: &str,
            w: &anelm_mil::WeightFiles,
        ) -> Result<anelm_ane::ProgramHandle, anelm_ane::AneError> {
            self.0.compile(mil, w)
        }
        fn load(&self, _: anelm_ane::ProgramHandle) -> Result<(), anelm_ane::AneError> {
            Err(anelm_ane::AneError::Framework("load failed".into()))
        }
        fn evaluate(
            &self,
            h: anelm_ane::ProgramHandle,
            i: &[&Surface],
            o: &mut [Surface],
        ) -> Result<anelm_ane::DispatchTime, anelm_ane::AneError> {
            self.0.evaluate(h, i, o)
        }
        fn unload(&self, h: anelm_ane::ProgramHandle) -> Result<(), anelm_ane::AneError> {
            self.0.unload(h)
        }
        fn release(&self, h: anelm_ane::ProgramHandle) -> Result<(), anelm_ane::AneError> {
            self.0.release(h)
        }
        fn signature(&self, h: anelm_ane::ProgramHandle) -> Result<anelm_ane::Signature, anelm_ane::AneError> {
            self.0.signature(h)
        }
    }

    /// Issue 37 item 4: every self-test program is released, whichever step failed.
    #[test]
    fn the_self_test_releases_its_programs_on_every_path() {
        let released = |dev: &dyn AneDevice| {
            (1..=2).all(|h| {
                matches!(
                    dev.signature(anelm_ane::ProgramHandle(h)),
                    Err(anelm_ane::AneError::UnknownHandle(_))
                )
            })
        };
        let mut buf = Console::new(Vec::new());
        let no_load = NoLoad(EmuAne::default());
        assert!(!self_test(&mut buf, &no_load, 2).unwrap());
        let text = String::from_utf8(buf.out).unwrap();
        assert!(text.contains("FAIL  64×64 fp16 loaded: load failed"), "{text}");
        assert!(released(&no_load), "a program whose load failed is released");
        let mut buf = Console::new(Vec::new());
        let broken = Broken(EmuAne::default());
        assert!(!self_test(&mut buf, &broken, 2).unwrap());
        assert!(released(&broken), "programs that computed the wrong thing are released");
        let mut buf = Console::new(Vec::new());
        let emu = EmuAne::default();
        assert!(self_test(&mut buf, &emu, 2).unwrap());
        assert!(released(&emu), "programs that passed are released");
        assert_eq!(emu.stats().loaded, 0);
    }

    #[test]
    fn a_device_that_computes_the_wrong_thing_fails_the_comparison() {
        let mut buf = Console::new(Vec::new());
        assert!(!self_test(&mut buf, &Broken(EmuAne::default()), 2).unwrap());
        let text = String::from_utf8(buf.out).unwrap();
        assert!(text.contains("FAIL  64×64 fp16 matches the CPU: max error"), "{text}");
        assert!(text.contains("ok    64×64 fp16 unloaded"), "{text}");
    }

    #[test]
    fn the_emulated_self_test_passes_and_a_broken_device_fails() {
        let mut buf = Console::new(Vec::new());
        assert!(self_test(&mut buf, &EmuAne::default(), 3).unwrap());
        let text = String::from_utf8(buf.out).unwrap();
        assert!(text.contains("ok    64×64 fp16 matches the CPU"), "{text}");
        assert!(
            text.contains("ok    64×64 int8 timed: median of 3 dispatches"),
            "{text}"
        );
        assert!(!text.contains("FAIL"), "{text}");
        // The reference itself must be able to fail the comparison.
        let (w, x) = test_data();
        let want: Vec<Vec<f32>> = x.iter().map(|v| reference(&w, v)).collect();
        let zeros = vec![vec![0.0; N]; x.len()];
        assert!(relative_error(&zeros, &want) > tolerance(WeightMode::Fp16));
    }

    fn refusing(refuse: &[&str]) -> Arc<EmuAne> {
        Arc::new(EmuAne::new(EmuConfig {
            refuse: refuse.iter().map(|s| s.to_string()).collect(),
            ..EmuConfig::default()
        }))
    }

    #[test]
    fn the_fallback_check_lists_each_fallback_and_still_matches_the_cpu() {
        let mut buf = Console::new(Vec::new());
        assert!(fallback_test(&mut buf, refusing(&[])).unwrap());
        let text = String::from_utf8(buf.out).unwrap();
        assert!(text.contains("no fallbacks: every kernel got its first form"), "{text}");
        assert!(
            text.contains("ok    ffn matches the CPU") && text.contains("ok    lm_head matches the CPU"),
            "{text}"
        );

        // int8 refused everywhere, the fused FFN refused, the LM head's 256-row output refused.
        let head = format!("[1, {FB_VOCAB}, 1, 32]> y = conv(");
        let dev = refusing(&["constexpr_blockwise_shift_scale", "xnorm", &head]);
        let mut buf = Console::new(Vec::new());
        assert!(fallback_test(&mut buf, dev).unwrap());
        let text = String::from_utf8(buf.out).unwrap();
        assert!(text.contains("3 fallback(s):"), "{text}");
        assert!(text.contains("ffn gate: ffn resadd → ffn plain"), "{text}");
        assert!(text.contains("ffn gate: swiglu_ffn int8 → swiglu_ffn fp16"), "{text}");
        assert!(text.contains("lm_head head: lm_head on ane-emu → cpu"), "{text}");
        assert!(text.contains("refused-form"), "{text}");
        assert!(!text.contains("FAIL"), "{text}");

        // Every FFN form refused: the check fails and says so.
        let mut buf = Console::new(Vec::new());
        assert!(!fallback_test(&mut buf, refusing(&["wg"])).unwrap());
        let text = String::from_utf8(buf.out).unwrap();
        assert!(
            text.contains("FAIL  ffn built") && text.contains("--device cpu"),
            "{text}"
        );
    }
}
