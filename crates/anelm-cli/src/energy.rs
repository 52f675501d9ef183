//! `anelm bench --energy`: average power and tokens per joule of generation on macOS.
//!
//! `powermetrics` (root only) samples the CPU, GPU and ANE rails every 200 ms while the process
//! runs: first an idle window (model loaded, nothing running), then the generation window. Only
//! samples lying wholly inside a window count for it, so model loading, compilation and
//! prefill-before-generation are never mixed in, and the energy is the generation window's own
//! average power × the generation time (the C++ system multiplied the whole run's average power
//! by the generation time; this does not). The idle baseline is subtracted for the net figure.
//!
//! What is measured: the three rails powermetrics reports (estimates from the SoC's energy
//! model, not a wall meter). Not measured: DRAM, display, SSD, power-supply losses; some chips
//! report no ANE rail at all (then it reads 0).

use std::fmt;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Sampling interval in milliseconds (as the reference's script).
pub const INTERVAL_MS: u32 = 200;

/// One powermetrics sample: its length and the rails it reported (milliwatts).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PowerSample {
    /// Seconds (on the caller's clock) when the sample's header arrived: the end of its interval.
    pub end: f64,
    /// Length of the sampled interval, ms (from the header).
    pub elapsed_ms: f64,
    /// CPU rail, mW.
    pub cpu_mw: Option<f64>,
    /// GPU rail, mW.
    pub gpu_mw: Option<f64>,
    /// ANE rail, mW.
    pub ane_mw: Option<f64>,
    /// Combined (CPU + GPU + ANE), mW.
    pub combined_mw: Option<f64>,
}

impl PowerSample {
    /// CPU + GPU + ANE in mW: the sum of the rails present, else the combined figure.
    pub fn total_mw(&self) -> Option<f64> {
        let rails = [self.cpu_mw, self.gpu_mw, self.ane_mw];
        if rails.iter().any(Option::is_some) {
            Some(rails.iter().flatten().sum())
        } else {
            self.combined_mw
        }
    }
}

/// Incremental parser of powermetrics' text output: feed it lines as they arrive.
#[derive(Debug, Default)]
pub struct PowerParser {
    /// Samples so far, in order.
    pub samples: Vec<PowerSample>,
}

/// `N mW` or `N W` → mW.
fn power_value(s: &str) -> Option<f64> {
    let s = s.trim();
    if let Some(v) = s.strip_suffix("mW") {
        v.trim().parse().ok()
    } else if let Some(v) = s.strip_suffix('W') {
        v.trim().parse::<f64>().ok().map(|w| w * 1000.0)
    } else {
        None
    }
}

/// The `(X ms elapsed)` of a sample header.
fn header_elapsed_ms(line: &str) -> Option<f64> {
    let i = line.find("ms elapsed)")?;
    let open = line[..i].rfind('(')?;
    line[open + 1..i].trim().parse().ok()
}

impl PowerParser {
    /// Take one line; `now` is when it arrived (seconds on the caller's clock).
    pub fn feed_line(&mut self, line: &str, now: f64) {
        let line = line.trim();
        if line.starts_with("*** Sampled system activity") {
            self.samples.push(PowerSample {
                end: now,
                elapsed_ms: header_elapsed_ms(line).unwrap_or(f64::from(INTERVAL_MS)),
                ..PowerSample::default()
            });
            return;
        }
        let Some(s) = self.samples.last_mut() else { return };
        let Some((key, value)) = line.split_once(':') else {
            return;
        };
        let slot = match key.trim() {
            "CPU Power" => &mut s.cpu_mw,
            "GPU Power" => &mut s.gpu_mw,
            "ANE Power" => &mut s.ane_mw,
            k if k.starts_with("Combined Power") => &mut s.combined_mw,
            _ => return,
        };
        // The first value of a sample wins (GPU Power is repeated in the GPU section).
        if slot.is_none() {
            *slot = power_value(value);
        }
    }
}

/// Parse a whole text output (every sample gets `end = 0`).
#[cfg(test)]
pub fn parse_powermetrics(text: &str) -> Vec<PowerSample> {
    let mut p = PowerParser::default();
    for line in text.lines() {
        p.feed_line(line, 0.0);
    }
    p.samples
}

/// Average watts per rail over a window.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Rails {
    /// CPU, W.
    pub cpu: f64,
    /// GPU, W.
    pub gpu: f64,
    /// ANE, W.
    pub ane: f64,
    /// CPU + GPU + ANE, W.
    pub total: f64,
    /// Samples averaged.
    pub samples: usize,
}

/// The time-weighted average of the samples lying wholly inside `[start, end]` (seconds), or
/// `None` when there is none.
pub fn average_in(samples: &[PowerSample], start: f64, end: f64) -> Option<Rails> {
    let inside: Vec<&PowerSample> = samples
        .iter()
        .filter(|s| s.end <= end && s.end - s.elapsed_ms / 1000.0 >= start && s.total_mw().is_some())
        .collect();
    let weight: f64 = inside.iter().map(|s| s.elapsed_ms).sum();
    if inside.is_empty() || weight <= 0.0 {
        return None;
    }
    let avg =
        |f: &dyn Fn(&PowerSample) -> f64| inside.iter().map(|s| f(s) * s.elapsed_ms).sum::<f64>() / weight / 1000.0;
    Some(Rails {
        cpu: avg(&|s| s.cpu_mw.unwrap_or(0.0)),
        gpu: avg(&|s| s.gpu_mw.unwrap_or(0.0)),
        ane: avg(&|s| s.ane_mw.unwrap_or(0.0)),
        total: avg(&|s| s.total_mw().unwrap_or(0.0)),
        samples: inside.len(),
    })
}

/// The energy figures of one generation run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EnergyReport {
    /// Idle baseline.
    pub idle: Rails,
    /// During generation.
    pub generation: Rails,
    /// Tokens generated.
    pub tokens: usize,
    /// Generation time, s.
    pub seconds: f64,
}

impl EnergyReport {
    /// Average power above idle, W (never below zero).
    pub fn net_watts(&self) -> f64 {
        (self.generation.total - self.idle.total).max(0.0)
    }

    /// Tokens per joule of the power above idle (`None` when that is zero).
    pub fn tokens_per_joule_net(&self) -> Option<f64> {
        let j = self.net_watts() * self.seconds;
        (j > 0.0).then(|| self.tokens as f64 / j)
    }

    /// Tokens per joule of all the power of the three rails during generation.
    pub fn tokens_per_joule_gross(&self) -> Option<f64> {
        let j = self.generation.total * self.seconds;
        (j > 0.0).then(|| self.tokens as f64 / j)
    }
}

/// The report for a run, from its samples and its two windows (seconds on one clock).
pub fn energy_report(
    samples: &[PowerSample],
    idle: (f64, f64),
    generation: (f64, f64),
    tokens: usize,
) -> Result<EnergyReport> {
    let Some(idle_avg) = average_in(samples, idle.0, idle.1) else {
        bail!(
            "no powermetrics sample lies inside the {:.1} s idle window; make it longer",
            idle.1 - idle.0
        );
    };
    let Some(gen_avg) = average_in(samples, generation.0, generation.1) else {
        bail!(
            "generation took {:.2} s, too short for a whole {INTERVAL_MS} ms powermetrics sample; generate more tokens (-n)",
            generation.1 - generation.0
        );
    };
    Ok(EnergyReport {
        idle: idle_avg,
        generation: gen_avg,
        tokens,
        seconds: generation.1 - generation.0,
    })
}

impl fmt::Display for EnergyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = |x: &Rails| {
            format!(
                "{:.2} W (CPU {:.2}, GPU {:.2}, ANE {:.2}; {} samples)",
                x.total, x.cpu, x.gpu, x.ane, x.samples
            )
        };
        let tpj = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.2}"));
        writeln!(
            f,
            "energy (powermetrics CPU+GPU+ANE rails, {INTERVAL_MS} ms samples inside each window)"
        )?;
        writeln!(f, "  idle baseline     {}", r(&self.idle))?;
        writeln!(f, "  generation        {}", r(&self.generation))?;
        writeln!(
            f,
            "  {} tokens in {:.2} s ({:.2} tok/s); above idle {:.2} W → {} tok/J (gross {} tok/J)",
            self.tokens,
            self.seconds,
            self.tokens as f64 / self.seconds.max(f64::MIN_POSITIVE),
            self.net_watts(),
            tpj(self.tokens_per_joule_net()),
            tpj(self.tokens_per_joule_gross())
        )
    }
}

/// Fail early unless this is macOS and we are root (powermetrics needs both).
pub fn check_available() -> Result<()> {
    if !cfg!(target_os = "macos") {
        bail!(
            "--energy needs macOS powermetrics (Apple Silicon, run as root: sudo anelm bench --energy); \
             this machine is {}",
            std::env::consts::OS
        );
    }
    let uid = Command::new("/usr/bin/id")
        .arg("-u")
        .output()
        .context("run /usr/bin/id -u")?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        bail!("powermetrics needs root: run sudo anelm bench --energy …");
    }
    Ok(())
}

/// A running powermetrics whose samples are parsed as they arrive.
struct Sampler {
    child: Child,
    parser: Arc<Mutex<PowerParser>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(t0: Instant) -> Result<Sampler> {
        let mut child = Command::new("/usr/bin/powermetrics")
            .args(["--samplers", "cpu_power,gpu_power,ane_power", "-i"])
            .arg(INTERVAL_MS.to_string())
            // Line-buffered, so each sample's arrival time is when it was taken.
            .args(["-b", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("start /usr/bin/powermetrics")?;
        let stdout = child.stdout.take().context("powermetrics stdout")?;
        let parser = Arc::new(Mutex::new(PowerParser::default()));
        let p = parser.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let now = t0.elapsed().as_secs_f64();
                p.lock().unwrap_or_else(|e| e.into_inner()).feed_line(&line, now);
            }
        });
        Ok(Sampler {
            child,
            parser,
            reader: Some(reader),
        })
    }

    fn count(&self) -> usize {
        self.parser.lock().unwrap_or_else(|e| e.into_inner()).samples.len()
    }

    fn stop(mut self) -> Vec<PowerSample> {
        self.kill();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        std::mem::take(&mut self.parser.lock().unwrap_or_else(|e| e.into_inner()).samples)
    }

    fn kill(&mut self) {
        // Our own child, by its handle.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sample an idle window of `idle`, then run `generate` (returns tokens generated) and report.
pub fn measure(idle: Duration, generate: impl FnOnce() -> Result<usize>) -> Result<EnergyReport> {
    let t0 = Instant::now();
    let now = || t0.elapsed().as_secs_f64();
    let sampler = Sampler::start(t0)?;
    // Wait for the first sample so powermetrics' start-up is not in the idle window.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sampler.count() == 0 {
        if Instant::now() > deadline {
            bail!("powermetrics printed no sample within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let idle_start = now();
    std::thread::sleep(idle);
    let idle_end = now();
    let gen_start = now();
    let tokens = generate()?;
    let gen_end = now();
    // Let the sample covering the end of generation arrive (it is discarded anyway if it straddles).
    std::thread::sleep(Duration::from_millis(u64::from(INTERVAL_MS) * 2));
    let samples = sampler.stop();
    energy_report(&samples, (idle_start, idle_end), (gen_start, gen_end), tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = include_str!("../tests/fixtures/powermetrics/text-3-samples.txt");

    #[test]
    fn parses_the_text_fixture() {
        let s = parse_powermetrics(FIXTURE);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].elapsed_ms, 201.34);
        assert_eq!(
            (s[0].cpu_mw, s[0].gpu_mw, s[0].ane_mw),
            (Some(1520.0), Some(12.0), Some(0.0))
        );
        assert_eq!(s[0].combined_mw, Some(1532.0));
        assert_eq!(s[1].ane_mw, Some(1875.0));
        assert_eq!(s[2].total_mw(), Some(6025.0));
        assert_eq!(s[2].elapsed_ms, 199.80);
    }

    #[test]
    fn values_and_headers() {
        assert_eq!(power_value(" 1520 mW"), Some(1520.0));
        assert_eq!(power_value("1.5 W"), Some(1500.0));
        assert_eq!(power_value("n/a"), None);
        assert_eq!(
            header_elapsed_ms("*** Sampled system activity (Wed) (200.12ms elapsed) ***"),
            Some(200.12)
        );
        assert_eq!(header_elapsed_ms("*** Sampled system activity ***"), None);
        let only_combined = PowerSample {
            combined_mw: Some(900.0),
            ..PowerSample::default()
        };
        assert_eq!(only_combined.total_mw(), Some(900.0));
        assert_eq!(PowerSample::default().total_mw(), None);
    }

    fn sample(end: f64, total_mw: f64) -> PowerSample {
        PowerSample {
            end,
            elapsed_ms: 200.0,
            cpu_mw: Some(total_mw),
            gpu_mw: Some(0.0),
            ane_mw: Some(0.0),
            combined_mw: Some(total_mw),
        }
    }

    #[test]
    fn windows_take_only_whole_samples_and_subtract_idle() {
        // 1 W idle until 2.0 s, 5 W from 2.0 s, with a 30 W load spike (model loading) before.
        let mut s = vec![sample(0.2, 30_000.0), sample(0.4, 30_000.0)];
        s.extend((3..=10).map(|i| sample(i as f64 * 0.2, 1000.0)));
        s.extend((11..=20).map(|i| sample(i as f64 * 0.2, 5000.0)));
        // The idle window starts after the spike; the generation window is [2.05, 4.0].
        let r = energy_report(&s, (0.4, 2.0), (2.05, 4.0), 100).unwrap();
        assert_eq!(r.idle.samples, 8);
        assert!((r.idle.total - 1.0).abs() < 1e-9, "{r:?}");
        // The sample ending at 2.2 starts at 2.0 < 2.05: it straddles and is left out.
        assert_eq!(r.generation.samples, 9);
        assert!((r.generation.total - 5.0).abs() < 1e-9);
        assert!((r.net_watts() - 4.0).abs() < 1e-9);
        let secs = 4.0 - 2.05;
        assert!((r.tokens_per_joule_net().unwrap() - 100.0 / (4.0 * secs)).abs() < 1e-9);
        assert!((r.tokens_per_joule_gross().unwrap() - 100.0 / (5.0 * secs)).abs() < 1e-9);
        let text = r.to_string();
        assert!(text.contains("above idle 4.00 W"), "{text}");
        // Whole-run averaging (the C++ mistake) would have counted the 30 W samples.
        let whole = average_in(&s, 0.0, 4.0).unwrap();
        assert!(whole.total > r.generation.total);
    }

    #[test]
    fn too_short_windows_are_errors() {
        let s: Vec<_> = (1..=10).map(|i| sample(i as f64 * 0.2, 1000.0)).collect();
        let e = energy_report(&s, (0.0, 1.0), (1.05, 1.3), 3).unwrap_err().to_string();
        assert!(e.contains("too short") && e.contains("-n"), "{e}");
        let e = energy_report(&s, (0.0, 0.1), (0.0, 2.0), 3).unwrap_err().to_string();
        assert!(e.contains("idle window"), "{e}");
    }

    #[test]
    fn off_macos_it_says_what_it_needs() {
        if cfg!(target_os = "macos") {
            return;
        }
        let e = check_available().unwrap_err().to_string();
        assert!(e.contains("needs macOS powermetrics"), "{e}");
    }
}
