//! The report `anelm doctor --report FILE` writes, and `anelm plan --calibrate REPORT` reads.
//!
//! A Mac user sends one JSON file: the machine (chip, macOS, the framework's version), the
//! length of the framework's model identifier, every doctor step with its outcome and time, and
//! a dispatch sweep (the median time of one fp16 linear kernel at a few sizes, fitted as
//! `fixed + bytes / bandwidth`). Off a Mac the file has the same shape: the Neural Engine's steps
//! say `unavailable` and the sweep runs on the emulator. Reading a report treats it as untrusted
//! input: every field is checked and a bad one is an error naming it.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use anelm_ane::{DispatchFit, SweepPoint};

/// `format` of every report.
pub const REPORT_FORMAT: &str = "anelm-doctor-report";
/// `version` of the report layout this build writes and reads.
pub const REPORT_VERSION: u64 = 1;

/// How one doctor step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It passed.
    Ok,
    /// It ran and failed.
    Fail,
    /// It could not run here (no Neural Engine).
    Unavailable,
}

impl Outcome {
    /// The report's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Unavailable => "unavailable",
        }
    }
}

/// One doctor step as the report records it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    /// The device the step ran on (`ane`, `ane-emu`, or `host`).
    pub device: String,
    /// What the step does (`64×64 fp16 compiled`).
    pub what: String,
    /// How it ended.
    pub outcome: Outcome,
    /// The printed detail or error.
    pub detail: String,
    /// Wall time since the previous step ended, ms.
    pub ms: f64,
}

/// Doctor's output: the text goes to `out` as it is printed, and every step is also recorded
/// with its outcome and time for the report.
pub struct Console<W: Write> {
    /// Where the text goes.
    pub out: W,
    device: String,
    last: Instant,
    /// The steps so far.
    pub steps: Vec<StepRecord>,
}

impl<W: Write> Console<W> {
    /// A console printing to `out`, with no steps yet.
    pub fn new(out: W) -> Self {
        Console {
            out,
            device: "host".into(),
            last: Instant::now(),
            steps: Vec::new(),
        }
    }

    /// The steps that follow run on `device`.
    pub fn section(&mut self, device: &str) {
        self.device = device.to_string();
        self.last = Instant::now();
    }

    /// Record a step that just ended.
    pub fn record(&mut self, what: &str, outcome: Outcome, detail: &str) {
        let now = Instant::now();
        self.steps.push(StepRecord {
            device: self.device.clone(),
            what: what.to_string(),
            outcome,
            detail: detail.to_string(),
            ms: (now - self.last).as_secs_f64() * 1e3,
        });
        self.last = now;
    }
}

impl<W: Write> Write for Console<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.out.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// A dispatch sweep as the report records it.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepRecord {
    /// The device it ran on.
    pub device: String,
    /// Timed dispatches per size.
    pub repeats: usize,
    /// The sizes, or the error that stopped the sweep.
    pub points: std::result::Result<Vec<SweepPoint>, String>,
}

/// What a report says about the machine.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MachineFacts {
    /// `(name, value)` lines of `doctor`'s machine section (os, arch, cpu, cores, simd, memory).
    pub machine: Vec<(&'static str, String)>,
    /// The chip (the CPU brand string on a Mac, e.g. `Apple M3 Max`).
    pub chip: Option<String>,
    /// `macOS 26.3.1 (25D…)` on a Mac.
    pub macos: Option<String>,
    /// AppleNeuralEngine.framework's version, when readable.
    pub framework: Option<String>,
    /// Why the real Neural Engine did not open (`None`: it opened).
    pub ane_unavailable: Option<String>,
    /// Length of the framework's model identifier (bytes), once a program was compiled.
    pub identifier_bytes: Option<usize>,
}

/// The report as JSON.
pub fn report_json(facts: &MachineFacts, steps: &[StepRecord], sweep: Option<&SweepRecord>) -> Value {
    let machine: serde_json::Map<String, Value> =
        facts.machine.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    let steps: Vec<Value> = steps
        .iter()
        .map(|s| json!({"device": s.device, "step": s.what, "outcome": s.outcome.name(), "detail": s.detail, "ms": s.ms}))
        .collect();
    let sweep = sweep.map(|s| {
        let (points, fit, error) = match &s.points {
            Ok(pts) => {
                let points: Vec<Value> = pts
                    .iter()
                    .map(|p| {
                        json!({
                            "size": p.size,
                            "bytes": p.bytes,
                            "ane_ms": p.ane_seconds * 1e3,
                            "wall_ms": p.wall_seconds * 1e3,
                            "run_ms": p.run_seconds * 1e3,
                            "runtime_us": p.runtime_us(),
                            "host_per_dispatch_us": p.host_per_dispatch_us(),
                        })
                    })
                    .collect();
                match DispatchFit::of_sweep(pts) {
                    Ok(f) => (
                        points,
                        json!({"fixed_us": f.fixed_us, "gb_s": f.gb_s, "max_residual": f.max_residual}),
                        Value::Null,
                    ),
                    Err(e) => (points, Value::Null, json!(e.to_string())),
                }
            }
            Err(e) => (Vec::new(), Value::Null, json!(e)),
        };
        json!({"device": s.device, "weights": "fp16", "repeats": s.repeats, "points": points, "fit": fit, "error": error})
    });
    json!({
        "format": REPORT_FORMAT,
        "version": REPORT_VERSION,
        "anelm_version": env!("CARGO_PKG_VERSION"),
        "machine": machine,
        "chip": facts.chip,
        "macos": facts.macos,
        "framework_version": facts.framework,
        "ane": match &facts.ane_unavailable {
            None => json!({"available": true}),
            Some(e) => json!({"available": false, "reason": e}),
        },
        "identifier_bytes": facts.identifier_bytes,
        "steps": steps,
        "dispatch_sweep": sweep,
    })
}

/// Write `report` to `path` (pretty-printed).
pub fn write_report(path: &Path, report: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(path, text + "\n").with_context(|| format!("could not write the report to {}", path.display()))
}

/// What `anelm plan --calibrate` takes from a report.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// The chip the report names, if any.
    pub chip: Option<String>,
    /// The device the sweep ran on.
    pub device: String,
    /// The line fitted through the sweep's points (refitted here, not trusted from the file).
    pub fit: DispatchFit,
}

/// Read a report and fit its dispatch sweep. Every field used is checked; a malformed report is
/// an error that names what is wrong.
pub fn read_calibration(path: &Path) -> Result<Calibration> {
    let text = std::fs::read_to_string(path).with_context(|| format!("could not read {}", path.display()))?;
    let v: Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not JSON; pass the file anelm doctor --report wrote",
            path.display()
        )
    })?;
    calibration_of(&v).with_context(|| format!("{} is not a usable anelm doctor report", path.display()))
}

fn calibration_of(v: &Value) -> Result<Calibration> {
    if v.get("format").and_then(Value::as_str) != Some(REPORT_FORMAT) {
        bail!("its \"format\" is not \"{REPORT_FORMAT}\"");
    }
    match v.get("version").and_then(Value::as_u64) {
        Some(REPORT_VERSION) => {}
        other => bail!("its \"version\" is {other:?}; this anelm reads version {REPORT_VERSION}"),
    }
    let sweep = v
        .get("dispatch_sweep")
        .filter(|s| !s.is_null())
        .context("it has no \"dispatch_sweep\" (run anelm doctor --report again)")?;
    let device = sweep
        .get("device")
        .and_then(Value::as_str)
        .context("\"dispatch_sweep.device\" is missing")?
        .to_string();
    let points = sweep
        .get("points")
        .and_then(Value::as_array)
        .context("\"dispatch_sweep.points\" is not a list")?;
    let mut xy = Vec::with_capacity(points.len());
    for (i, p) in points.iter().enumerate() {
        let bytes = p.get("bytes").and_then(Value::as_u64);
        let ms = p.get("ane_ms").and_then(Value::as_f64);
        match (bytes, ms) {
            (Some(b), Some(t)) => xy.push((b, t * 1e-3)),
            _ => bail!("dispatch_sweep.points[{i}] needs a whole \"bytes\" and a numeric \"ane_ms\""),
        }
    }
    let fit = anelm_ane::fit_dispatch(&xy)?;
    let chip = v.get("chip").and_then(Value::as_str).map(str::to_string);
    Ok(Calibration { chip, device, fit })
}

/// The `--chip` profile name a chip brand string (`Apple M3 Max`) corresponds to, if any.
pub fn profile_name(brand: &str) -> Option<String> {
    let b = brand.trim().to_ascii_lowercase();
    let rest = b.strip_prefix("apple ")?;
    let name = rest.split_whitespace().collect::<Vec<_>>().join("-");
    anelm_ane::ChipProfile::by_name(&name).map(|c| c.name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synthetic(fixed_us: f64, gb_s: f64) -> Value {
        let facts = MachineFacts {
            chip: Some("Apple M4 Pro".into()),
            ane_unavailable: Some("no Neural Engine".into()),
            ..MachineFacts::default()
        };
        let points = [1u64 << 20, 8 << 20, 32 << 20]
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                let t = fixed_us * 1e-6 + b as f64 / (gb_s * 1e9);
                SweepPoint {
                    size: 512 << i,
                    bytes: b,
                    ane_seconds: t,
                    wall_seconds: t,
                    run_seconds: t + 20e-6,
                }
            })
            .collect();
        let sweep = SweepRecord {
            device: "ane".into(),
            repeats: 5,
            points: Ok(points),
        };
        report_json(&facts, &[], Some(&sweep))
    }

    #[test]
    fn a_report_round_trips_into_its_fit() {
        let c = calibration_of(&synthetic(140.0, 95.0)).unwrap();
        assert!(
            (c.fit.fixed_us - 140.0).abs() < 1e-3 && (c.fit.gb_s - 95.0).abs() < 1e-6,
            "{c:?}"
        );
        assert_eq!((c.chip.as_deref(), c.device.as_str()), (Some("Apple M4 Pro"), "ane"));
        assert_eq!(profile_name("Apple M4 Pro").as_deref(), Some("m4-pro"));
        assert_eq!(profile_name("Apple M3 Max").as_deref(), Some("m3-max"));
        assert_eq!(profile_name("AMD EPYC 7B13"), None);
    }

    #[test]
    fn a_malformed_report_is_an_error_not_a_panic() {
        let good = synthetic(140.0, 95.0);
        let mut cases: Vec<(Value, &str)> = Vec::new();
        let mut v = good.clone();
        v["format"] = json!("something else");
        cases.push((v, "format"));
        let mut v = good.clone();
        v["version"] = json!(99);
        cases.push((v, "version"));
        let mut v = good.clone();
        v["dispatch_sweep"] = Value::Null;
        cases.push((v, "dispatch_sweep"));
        let mut v = good.clone();
        v["dispatch_sweep"]["points"][1]["bytes"] = json!(-3);
        cases.push((v, "points[1]"));
        let mut v = good.clone();
        v["dispatch_sweep"]["points"] = json!([good["dispatch_sweep"]["points"][0]]);
        cases.push((v, "distinct sizes"));
        let mut v = good.clone();
        v["dispatch_sweep"]["points"][0]["ane_ms"] = json!(1e6);
        cases.push((v, "too noisy"));
        cases.push((json!([1, 2]), "format"));
        for (v, needle) in cases {
            let e = format!("{:#}", calibration_of(&v).unwrap_err());
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }

    #[test]
    fn the_console_records_each_step_with_its_device_and_time() {
        let mut c = Console::new(Vec::new());
        c.record("opened", Outcome::Unavailable, "no Neural Engine");
        c.section("ane-emu");
        writeln!(c, "text").unwrap();
        c.record("compiled", Outcome::Ok, "1 ms");
        assert_eq!(String::from_utf8(c.out.clone()).unwrap(), "text\n");
        assert_eq!(c.steps.len(), 2);
        assert_eq!(
            (c.steps[0].device.as_str(), c.steps[0].outcome),
            ("host", Outcome::Unavailable)
        );
        assert_eq!(
            (c.steps[1].device.as_str(), c.steps[1].what.as_str()),
            ("ane-emu", "compiled")
        );
        assert!(c.steps.iter().all(|s| s.ms >= 0.0));
        let j = report_json(&MachineFacts::default(), &c.steps, None);
        assert_eq!(j["steps"][0]["outcome"], "unavailable");
        assert_eq!(j["steps"][1]["device"], "ane-emu");
        assert!(j["dispatch_sweep"].is_null());
    }
}
