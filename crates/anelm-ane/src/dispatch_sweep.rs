//! The dispatch micro-benchmark of `anelm doctor --report`, and the line fitted through it.
//!
//! One plain fp16 linear kernel per size is compiled, loaded and evaluated a few times on a
//! device; the median evaluation time of each size against the bytes the dispatch moves is
//! fitted by least squares as `fixed + bytes / bandwidth`, the form a [`ChipProfile`] describes a
//! chip in. `anelm plan --calibrate REPORT` plans with the fitted line instead of the profile's,
//! so one report from a Mac replaces the constants the planner borrowed from other runtimes.

use std::time::{Duration, Instant};

use thiserror::Error;

use crate::chip::ChipProfile;
use crate::device::{AneDevice, Releasing, compile_and_load};
use crate::error::{AneError, LowerError, SurfaceError};
use crate::kernel::{AneKernel, WeightMode};
use crate::kernel_run::{LoadedProgram, ProgramLayout};
use crate::lower::lower;
use crate::surface::Surface;

/// Square linear kernels the sweep times on a Neural Engine: 0.5 to 33.6 MB of fp16 weights,
/// wide enough apart that the byte term separates from the fixed cost.
pub const DEVICE_SWEEP_SIZES: [usize; 4] = [512, 1024, 2048, 4096];

/// Smaller sizes for the emulator, which computes every product in software (its clock is the
/// chip profile's line, so any sizes recover it).
pub const EMULATOR_SWEEP_SIZES: [usize; 4] = [64, 128, 256, 512];

/// One size of the sweep: what one dispatch moved and how long it took (medians).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweepPoint {
    /// Rows and columns of the square kernel.
    pub size: usize,
    /// Bytes one dispatch moves as the device counts them (weights plus surfaces).
    pub bytes: u64,
    /// Median Neural Engine time of a dispatch (measured around the evaluate call on a Mac,
    /// modelled by the emulator), seconds.
    pub ane_seconds: f64,
    /// Median wall time of a dispatch including surface copies, seconds.
    pub wall_seconds: f64,
    /// Median wall time of the same dispatch through the runtime's own path for one lane
    /// ([`ProgramLayout::run`]: a pooled surface packed, evaluated, the lane unpacked), seconds.
    pub run_seconds: f64,
}

impl SweepPoint {
    /// What the runtime adds around the device call per dispatch, µs: packing and unpacking
    /// one lane and its bookkeeping (`run − wall`, meaningful on the emulator too).
    pub fn runtime_us(&self) -> f64 {
        (self.run_seconds - self.wall_seconds) * 1e6
    }

    /// The host's whole cost per dispatch beyond the Neural Engine's own time, µs (`run −
    /// ane`): on a Mac the figure `anelm plan` assumes as the reused-request dispatch cost plus
    /// one lane's surfaces. Meaningless on the emulator, whose wall time is its arithmetic.
    pub fn host_per_dispatch_us(&self) -> f64 {
        (self.run_seconds - self.ane_seconds) * 1e6
    }
}

/// A dispatch cost line `fixed + bytes / bandwidth` fitted through a sweep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DispatchFit {
    /// Fixed cost per dispatch, µs.
    pub fixed_us: f64,
    /// Bandwidth, GB/s (10⁹ bytes per second).
    pub gb_s: f64,
    /// Largest |measured − fitted| / measured over the points.
    pub max_residual: f64,
}

/// A sweep that cannot be fitted.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum FitError {
    /// Fewer than two distinct sizes.
    #[error("the dispatch sweep has {0} distinct sizes; a line needs at least 2")]
    TooFewSizes(usize),
    /// A time or byte count that is not a finite positive number.
    #[error("the dispatch sweep has an unusable point ({0})")]
    BadPoint(String),
    /// Time does not grow with bytes, or the line crosses below zero at zero bytes.
    #[error(
        "the dispatch times do not fit fixed + bytes / bandwidth (fixed {fixed_us:.1} µs, {per_gb:.4} ms per GB): \
         too noisy; run anelm doctor again on a quiet machine"
    )]
    Unphysical {
        /// The fitted intercept, µs.
        fixed_us: f64,
        /// The fitted slope, ms per GB.
        per_gb: f64,
    },
}

/// The sweep could not time a size.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SweepError {
    /// The kernel did not lower (a size the kernel catalogue refuses).
    #[error("the sweep kernel does not lower: {0}")]
    Lower(#[from] LowerError),
    /// The input surface could not be packed.
    #[error("the sweep input does not pack: {0}")]
    Surface(#[from] SurfaceError),
    /// The device refused a call.
    #[error("{0}")]
    Device(#[from] AneError),
    /// The runtime's path (`ProgramLayout::run`) failed.
    #[error("the sweep's runtime dispatch failed: {0}")]
    Run(String),
}

/// Least-squares line through `(bytes, seconds)` points: the fixed cost and the bandwidth.
pub fn fit_dispatch(points: &[(u64, f64)]) -> Result<DispatchFit, FitError> {
    if let Some((b, t)) = points.iter().find(|(b, t)| *b == 0 || !t.is_finite() || *t <= 0.0) {
        return Err(FitError::BadPoint(format!("{b} bytes in {t} s")));
    }
    let mut sizes: Vec<u64> = points.iter().map(|p| p.0).collect();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.len() < 2 {
        return Err(FitError::TooFewSizes(sizes.len()));
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0 as f64).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 as f64 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 as f64 - mx) * (p.1 - my)).sum();
    let slope = sxy / sxx;
    let intercept = my - slope * mx;
    if !(slope > 0.0 && intercept >= 0.0 && slope.is_finite() && intercept.is_finite()) {
        return Err(FitError::Unphysical {
            fixed_us: intercept * 1e6,
            per_gb: slope * 1e9 * 1e3,
        });
    }
    let max_residual = points
        .iter()
        .map(|&(b, t)| ((intercept + slope * b as f64) - t).abs() / t)
        .fold(0.0, f64::max);
    Ok(DispatchFit {
        fixed_us: intercept * 1e6,
        gb_s: 1.0 / slope / 1e9,
        max_residual,
    })
}

impl DispatchFit {
    /// The fit through a sweep's median Neural Engine times.
    pub fn of_sweep(points: &[SweepPoint]) -> Result<DispatchFit, FitError> {
        let xy: Vec<(u64, f64)> = points.iter().map(|p| (p.bytes, p.ane_seconds)).collect();
        fit_dispatch(&xy)
    }
}

impl ChipProfile {
    /// This profile with its dispatch line replaced by a measured one: the fixed cost, and the
    /// bandwidth both as the emulator's clock and as the planner's streaming rate (the sweep
    /// times weight streams directly). The host constants stay the profile's.
    pub fn calibrated(&self, fit: &DispatchFit) -> ChipProfile {
        ChipProfile {
            fixed_us: fit.fixed_us,
            fixed_source: "calibrated: fitted through an anelm doctor --report dispatch sweep",
            bandwidth_gb_s: fit.gb_s,
            stream_gb_s: fit.gb_s,
            bandwidth_source: "calibrated: fitted through an anelm doctor --report dispatch sweep",
            ..*self
        }
    }
}

/// Deterministic weights of an `n × n` kernel, small enough that fp16 outputs stay finite.
fn sweep_weights(n: usize) -> Vec<f32> {
    (0..n * n).map(|i| ((i * 7) % 13) as f32 / 64.0 - 0.09).collect()
}

/// Time one `n × n` fp16 linear kernel: a warm-up dispatch, then `repeats` timed ones.
fn time_size(dev: &dyn AneDevice, n: usize, repeats: usize) -> Result<SweepPoint, SweepError> {
    let kernel = AneKernel::Linear { rows: n, cols: n };
    let low = lower(&kernel, &[&sweep_weights(n)], WeightMode::Fp16)?;
    let mut guard = Releasing::new(dev);
    let h = compile_and_load(dev, &low.mil_text(), &low.weights)?;
    guard.add(h);
    let x: Vec<f32> = (0..n).map(|c| (c % 5) as f32 / 8.0).collect();
    // One lane, as the runtime path below carries (the device's time does not depend on it).
    let input = Surface::pack(n, &[&x])?;
    let mut outputs = dev.signature(h)?.output_surfaces();
    let warm = dev.evaluate(h, &[&input], &mut outputs)?;
    let mut ane = Vec::with_capacity(repeats);
    let mut wall = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        let t = dev.evaluate(h, &[&input], &mut outputs)?;
        ane.push(t.ane);
        wall.push(t.host);
    }
    let layout = ProgramLayout::Rows(vec![LoadedProgram {
        handle: h,
        weight_bytes: kernel.weight_bytes(WeightMode::Fp16) as u64,
        outputs: n,
        kernel,
    }]);
    let mut y = vec![0.0f32; n];
    let mut run = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        let start = Instant::now();
        layout
            .run(dev, n, n, 1, &x, None, &mut y)
            .map_err(|e| SweepError::Run(e.to_string()))?;
        run.push(start.elapsed());
    }
    drop(guard);
    Ok(SweepPoint {
        size: n,
        bytes: warm.bytes,
        ane_seconds: median(ane).as_secs_f64(),
        wall_seconds: median(wall).as_secs_f64(),
        run_seconds: median(run).as_secs_f64(),
    })
}

/// Time one fp16 linear kernel of each size in `sizes` on `dev` (`repeats` dispatches each, the
/// median kept); every program is released again, errors included.
pub fn dispatch_sweep(dev: &dyn AneDevice, sizes: &[usize], repeats: usize) -> Result<Vec<SweepPoint>, SweepError> {
    sizes.iter().map(|&n| time_size(dev, n, repeats)).collect()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    match v.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::EmuAne;

    #[test]
    fn the_fit_recovers_a_known_line_and_refuses_bad_sweeps() {
        let line = |b: u64| 150e-6 + b as f64 / 90e9;
        let pts: Vec<(u64, f64)> = [1u64 << 20, 8 << 20, 32 << 20].iter().map(|&b| (b, line(b))).collect();
        let f = fit_dispatch(&pts).unwrap();
        assert!(
            (f.fixed_us - 150.0).abs() < 1e-6 && (f.gb_s - 90.0).abs() < 1e-9,
            "{f:?}"
        );
        assert!(f.max_residual < 1e-9);
        assert_eq!(fit_dispatch(&pts[..1]), Err(FitError::TooFewSizes(1)));
        assert!(matches!(
            fit_dispatch(&[(10, 1.0), (20, 0.5)]),
            Err(FitError::Unphysical { .. })
        ));
        assert!(matches!(
            fit_dispatch(&[(10, 1.0), (0, 0.5)]),
            Err(FitError::BadPoint(_))
        ));
        assert!(matches!(
            fit_dispatch(&[(10, f64::NAN), (20, 0.5)]),
            Err(FitError::BadPoint(_))
        ));
    }

    #[test]
    fn the_emulators_sweep_fits_its_own_clock_and_releases_everything() {
        let emu = EmuAne::default();
        let pts = dispatch_sweep(&emu, &EMULATOR_SWEEP_SIZES[..3], 3).unwrap();
        assert_eq!(pts.iter().map(|p| p.size).collect::<Vec<_>>(), vec![64, 128, 256]);
        assert!(pts.windows(2).all(|w| w[1].bytes > w[0].bytes));
        let f = DispatchFit::of_sweep(&pts).unwrap();
        let chip = ChipProfile::m3_max();
        assert!((f.fixed_us - chip.fixed_us).abs() < 0.5, "{f:?}");
        assert!((f.gb_s / chip.bandwidth_gb_s - 1.0).abs() < 0.01, "{f:?}");
        assert_eq!(emu.stats().loaded, 0);
        let cal = chip.calibrated(&DispatchFit {
            fixed_us: 50.0,
            gb_s: 200.0,
            max_residual: 0.0,
        });
        assert_eq!(
            (cal.fixed_us, cal.stream_gb_s, cal.bandwidth_gb_s),
            (50.0, 200.0, 200.0)
        );
        assert_eq!(cal.host, chip.host);
    }
}
