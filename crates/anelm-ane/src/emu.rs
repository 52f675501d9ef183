//! The emulated Neural Engine: validates MIL text + blob bytes against the hardware rules,
//! executes accepted programs in fp16, and charges each dispatch on a virtual clock.
//!
//! The clock also keeps a schedule: the host work between evaluations is what this machine's
//! threads really took (measured from one evaluation's return to the next one's call, so the
//! emulator's own arithmetic is not counted), and the programs take their modelled time. Since
//! an evaluation is synchronous, the schedule is the host's gaps plus the programs' times: a
//! real host beside a modelled Neural Engine (issue 38), whose tokens per second and per-side
//! shares an emulated run reports.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anelm_mil::{WeightFiles, f16, parse_program};

use crate::chip::ChipProfile;
use crate::device::{AneDevice, CompileBudget, DispatchTime, ProgramHandle, Signature};
use crate::error::AneError;
use crate::exec::{Executable, Tensor, round_fp16};
use crate::limits::Limits;
use crate::rules::{DEFAULT_MAX_COMPILES, Rule};
use crate::surface::Surface;
use crate::validate::{load_validated, validate};

/// Default per-process budget of simultaneously loaded programs: 229, the most kernels seen
/// loaded at once (FG, M3 Max; ane-hardware.md §4.7). Qwen3-4B's 226 fit.
pub const DEFAULT_MAX_LOADED: usize = 229;

/// Emulator settings.
#[derive(Debug, Clone, PartialEq)]
pub struct EmuConfig {
    /// Chip profile for the cost model.
    pub chip: ChipProfile,
    /// Per-process budget of simultaneously loaded programs ([`Rule::LoadBudget`]).
    pub max_loaded_programs: usize,
    /// Optional budget of loaded constant bytes ([`Rule::LoadedBytes`]; FG measured ~3.5 GB on
    /// M3 Max / macOS 26, [`crate::FG_MAX_LOADED_BYTES`], which contradicts models that ran; off
    /// by default).
    pub max_loaded_bytes: Option<u64>,
    /// Per-process compile budget ([`Rule::CompileBudget`]; default 119, `None`: unlimited).
    /// Loads from the compile cache do not count.
    pub max_compiles: Option<usize>,
    /// What the device accepts (the validator's caps; the planner's choices are unused here).
    pub limits: Limits,
    /// Flush fp16 subnormals to zero after every op (the ANE appears to; ane-hardware.md §3.7).
    pub flush_subnormals: bool,
    /// **Test knob**: refuse at compile time ([`Rule::Refused`]) every program whose MIL text
    /// contains one of these strings, as a compiler that refuses that form would. For example
    /// `constexpr_blockwise_shift_scale` refuses every int8 program, `xnorm` the fused FFN with
    /// its residual add (`swiglu_ffn_residual`), `tensor<fp16, [1, 512, 1, 32]> y` a 512-row
    /// linear. Empty (the default) refuses nothing. The CLI reads it from [`EMU_REFUSE_ENV`].
    pub refuse: Vec<String>,
    /// **Test knob**: every program whose MIL text contains one of these strings compiles and
    /// loads but fails at evaluation ([`Rule::Refused`]), as a program the hardware takes and
    /// then fails with status 0x1d would (Orion: unequal or too small surfaces). The ANE backend's
    /// smoke dispatch turns that into a refusal the fallback chain handles. Empty by default.
    pub fail_evaluate: Vec<String>,
}

/// Environment variable the CLI reads [`EmuConfig::refuse`] from (`;`-separated strings), so the
/// fallback chain can be shown on `--device ane-emu` (`anelm bench`, `anelm doctor`) off a Mac.
pub const EMU_REFUSE_ENV: &str = "ANELM_EMU_REFUSE";

impl EmuConfig {
    /// The strings of [`EMU_REFUSE_ENV`] (empty when unset).
    pub fn refuse_from_env() -> Vec<String> {
        std::env::var(EMU_REFUSE_ENV)
            .map(|v| parse_refuse(&v))
            .unwrap_or_default()
    }

    /// The error every evaluation of `mil_text` gives, if it contains a string of
    /// [`EmuConfig::fail_evaluate`].
    fn evaluation_failure(&self, mil_text: &str) -> Option<String> {
        self.fail_evaluate
            .iter()
            .find(|r| mil_text.contains(r.as_str()))
            .map(|r| {
                format!(
                    "the program contains `{r}`, which this emulator is configured to fail at evaluation (as \
                     status 0x1d would)"
                )
            })
    }

    /// The error for `mil_text` if it contains a string of [`EmuConfig::refuse`].
    fn refusal(&self, mil_text: &str) -> Result<(), AneError> {
        match self.refuse.iter().find(|r| mil_text.contains(r.as_str())) {
            Some(r) => Err(AneError::rule_err(
                Rule::Refused,
                format!("the program contains `{r}`, which this emulator is configured to refuse"),
            )),
            None => Ok(()),
        }
    }
}

/// `;`-separated, trimmed, non-empty strings.
fn parse_refuse(v: &str) -> Vec<String> {
    v.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

impl Default for EmuConfig {
    fn default() -> Self {
        EmuConfig {
            chip: ChipProfile::m3_max(),
            max_loaded_programs: DEFAULT_MAX_LOADED,
            max_loaded_bytes: None,
            max_compiles: Some(DEFAULT_MAX_COMPILES),
            limits: Limits::default(),
            flush_subnormals: true,
            refuse: Vec::new(),
            fail_evaluate: Vec::new(),
        }
    }
}

/// Counters and clocks of an emulated device.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EmuStats {
    /// Compiles attempted (successful or refused by a program rule; what the compile budget counts).
    pub compile_attempts: u64,
    /// Successful compiles.
    pub compiles: u64,
    /// Successful loads.
    pub loads: u64,
    /// Programs loaded without compiling (compile-cache hits).
    pub cache_loads: u64,
    /// Programs loaded now.
    pub loaded: usize,
    /// Constant bytes of the programs loaded now.
    pub loaded_bytes: u64,
    /// Evaluations.
    pub dispatches: u64,
    /// Bytes moved by all evaluations.
    pub bytes: u64,
    /// Measured host time of all evaluations.
    pub host_time: Duration,
    /// Modelled ANE time of all evaluations (the virtual clock).
    pub ane_time: Duration,
    /// Host time on the schedule's critical path: the measured gaps between one evaluation's
    /// return and the next call (host work done while a program runs, on another thread, is off
    /// this path).
    pub host_critical_time: Duration,
}

impl EmuStats {
    /// The schedule's length: from the first evaluation's call to the last one's return, the
    /// host's gaps as measured and the programs as modelled.
    pub fn schedule_time(&self) -> Duration {
        self.ane_time + self.host_critical_time
    }

    /// The share of the schedule the modelled Neural Engine was busy.
    pub fn ane_utilisation(&self) -> f64 {
        self.ane_time.as_secs_f64() / self.schedule_time().as_secs_f64().max(1e-12)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Compiled,
    Loaded,
    Unloaded,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Compiled => "compiled (not loaded)",
            State::Loaded => "loaded",
            State::Unloaded => "unloaded",
        }
    }
}

#[derive(Debug)]
struct Entry {
    exe: Arc<Executable>,
    state: State,
    /// Every evaluation fails with this ([`EmuConfig::fail_evaluate`]).
    eval_failure: Option<String>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    programs: BTreeMap<u64, Entry>,
    stats: EmuStats,
    /// When (real time) the latest evaluation returned: the start of the host's current gap.
    last_return: Option<Instant>,
}

/// A software Neural Engine. Thread-safe; evaluations of different programs run concurrently.
#[derive(Debug, Default)]
pub struct EmuAne {
    cfg: EmuConfig,
    inner: Mutex<Inner>,
}

impl EmuAne {
    /// An emulator with `cfg`.
    pub fn new(cfg: EmuConfig) -> Self {
        EmuAne {
            cfg,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// An emulator for `chip` with default limits.
    pub fn for_chip(chip: ChipProfile) -> Self {
        EmuAne::new(EmuConfig {
            chip,
            ..EmuConfig::default()
        })
    }

    /// The settings.
    pub fn config(&self) -> &EmuConfig {
        &self.cfg
    }

    /// Counters and clocks so far.
    pub fn stats(&self) -> EmuStats {
        self.lock().stats
    }

    /// Reset the dispatch counters and both clocks (compile/load counters and loaded state stay).
    pub fn reset_clock(&self) {
        let mut g = self.lock();
        g.stats.dispatches = 0;
        g.stats.bytes = 0;
        g.stats.host_time = Duration::ZERO;
        g.stats.ane_time = Duration::ZERO;
        g.stats.host_critical_time = Duration::ZERO;
        g.last_return = None;
    }

    /// Forget a compiled program (unloading it first if loaded).
    pub fn release(&self, program: ProgramHandle) -> Result<(), AneError> {
        let mut g = self.lock();
        let e = g
            .programs
            .remove(&program.0)
            .ok_or(AneError::UnknownHandle(program.0))?;
        if e.state == State::Loaded {
            g.stats.loaded -= 1;
            g.stats.loaded_bytes = g.stats.loaded_bytes.saturating_sub(e.exe.const_bytes);
        }
        Ok(())
    }

    /// Validate MIL text and weights without keeping a program (what `compile` checks).
    pub fn check(&self, mil_text: &str, weights: &WeightFiles) -> Result<(), AneError> {
        self.cfg.refusal(mil_text)?;
        let program = parse_program(mil_text)?;
        validate(&program, weights, &self.cfg).map(|_| ())
    }

    fn insert(&self, exe: Executable, state: State, compiled: bool, eval_failure: Option<String>) -> ProgramHandle {
        let mut g = self.lock();
        g.next += 1;
        let h = g.next;
        g.programs.insert(
            h,
            Entry {
                exe: Arc::new(exe),
                state,
                eval_failure,
            },
        );
        if compiled {
            g.stats.compiles += 1;
        }
        ProgramHandle(h)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave Inner inconsistent (every update is a
        // single assignment), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn entry(g: &mut Inner, h: ProgramHandle) -> Result<&mut Entry, AneError> {
        g.programs.get_mut(&h.0).ok_or(AneError::UnknownHandle(h.0))
    }
}

impl AneDevice for EmuAne {
    fn name(&self) -> &str {
        "ane-emu"
    }

    fn compile(&self, mil_text: &str, weights: &WeightFiles) -> Result<ProgramHandle, AneError> {
        let program = parse_program(mil_text)?;
        {
            // The compiler's leak is per call, so every attempt that reaches it counts.
            let mut g = self.lock();
            if let Some(max) = self.cfg.max_compiles {
                if g.stats.compile_attempts >= max as u64 {
                    return Err(AneError::rule_err(
                        Rule::CompileBudget,
                        format!(
                            "this process has made {} compiles, the per-process budget of {max}; another would \
                             exceed it",
                            g.stats.compile_attempts
                        ),
                    ));
                }
            }
            g.stats.compile_attempts += 1;
        }
        self.cfg.refusal(mil_text)?;
        let exe = validate(&program, weights, &self.cfg)?;
        Ok(self.insert(exe, State::Compiled, true, self.cfg.evaluation_failure(mil_text)))
    }

    fn load_without_compile(&self, mil_text: &str, weights: &WeightFiles) -> Result<ProgramHandle, AneError> {
        self.cfg.refusal(mil_text)?;
        let program = parse_program(mil_text)?;
        let exe = load_validated(&program, weights, &self.cfg)?;
        let h = self.insert(exe, State::Compiled, false, self.cfg.evaluation_failure(mil_text));
        if let Err(e) = self.load(h) {
            let _ = self.release(h);
            return Err(e);
        }
        self.lock().stats.cache_loads += 1;
        Ok(h)
    }

    fn limits(&self) -> Limits {
        self.cfg.limits
    }

    fn compile_budget(&self) -> Option<CompileBudget> {
        self.cfg.max_compiles.map(|max| CompileBudget {
            max: max as u64,
            used: self.lock().stats.compile_attempts,
        })
    }

    fn cache_salt(&self) -> String {
        // Everything but the chip profile decides acceptance.
        let c = &self.cfg;
        format!(
            "ane-emu {} dim {} conv {} elems {} const {} weights {} align128 {} flush {} refuse {:?}",
            env!("CARGO_PKG_VERSION"),
            c.limits.max_dim,
            c.limits.max_conv_input_channels,
            c.limits.max_tensor_elements,
            c.limits.max_kernel_const_bytes,
            c.limits.max_program_weight_bytes,
            c.chip.aligns_io_to_128(),
            c.flush_subnormals,
            c.refuse
        )
    }

    fn load(&self, program: ProgramHandle) -> Result<(), AneError> {
        let cfg = &self.cfg;
        let mut g = self.lock();
        let (loaded, loaded_bytes) = (g.stats.loaded, g.stats.loaded_bytes);
        let e = Self::entry(&mut g, program)?;
        if e.state == State::Loaded {
            return Err(AneError::State {
                handle: program.0,
                call: "load",
                state: e.state.name(),
            });
        }
        if loaded + 1 > cfg.max_loaded_programs {
            return Err(AneError::rule_err(
                Rule::LoadBudget,
                format!(
                    "{loaded} programs are loaded and the per-process budget is {}",
                    cfg.max_loaded_programs
                ),
            ));
        }
        let bytes = e.exe.const_bytes;
        if let Some(max) = cfg.max_loaded_bytes {
            if loaded_bytes.saturating_add(bytes) > max {
                return Err(AneError::rule_err(
                    Rule::LoadedBytes,
                    format!("{loaded_bytes} constant bytes are loaded, this program adds {bytes}, the budget is {max}"),
                ));
            }
        }
        e.state = State::Loaded;
        g.stats.loaded += 1;
        g.stats.loaded_bytes += bytes;
        g.stats.loads += 1;
        Ok(())
    }

    fn evaluate(
        &self,
        program: ProgramHandle,
        inputs: &[&Surface],
        outputs: &mut [Surface],
    ) -> Result<DispatchTime, AneError> {
        let called = Instant::now();
        let exe = {
            let mut g = self.lock();
            let e = Self::entry(&mut g, program)?;
            if e.state != State::Loaded {
                return Err(AneError::State {
                    handle: program.0,
                    call: "evaluate",
                    state: e.state.name(),
                });
            }
            if let Some(why) = &e.eval_failure {
                return Err(AneError::rule_err(Rule::Refused, why.clone()));
            }
            e.exe.clone()
        };
        let start = Instant::now();
        check_surfaces("input", &exe.inputs, inputs.iter().map(|s| (s.channels(), s.lanes())))?;
        check_surfaces(
            "output",
            &exe.outputs,
            outputs.iter().map(|s| (s.channels(), s.lanes())),
        )?;
        let flush = self.cfg.flush_subnormals;
        let tensors = exe
            .inputs
            .iter()
            .zip(inputs)
            .map(|((_, shape), s)| Tensor {
                shape: shape.clone(),
                data: s.halves().iter().map(|h| round_fp16(h.to_f32(), flush)).collect(),
            })
            .collect();
        let results = exe.run(tensors)?;
        let mut io_bytes = 0u64;
        for s in inputs {
            io_bytes += s.byte_len() as u64;
        }
        for (out, t) in outputs.iter_mut().zip(&results) {
            for (h, &v) in out.halves_mut().iter_mut().zip(&t.data) {
                *h = f16::from_f32(v);
            }
            io_bytes += out.byte_len() as u64;
        }
        let host = start.elapsed();
        let bytes = exe.const_bytes + io_bytes;
        let ane = self.cfg.chip.dispatch_time(bytes);
        let mut g = self.lock();
        g.stats.dispatches += 1;
        g.stats.bytes += bytes;
        g.stats.host_time += host;
        g.stats.ane_time += ane;
        if let Some(r) = g.last_return {
            g.stats.host_critical_time += called.saturating_duration_since(r);
        }
        g.last_return = Some(Instant::now());
        Ok(DispatchTime { host, ane, bytes })
    }

    fn release(&self, program: ProgramHandle) -> Result<(), AneError> {
        EmuAne::release(self, program)
    }

    fn unload(&self, program: ProgramHandle) -> Result<(), AneError> {
        let mut g = self.lock();
        let e = Self::entry(&mut g, program)?;
        if e.state != State::Loaded {
            return Err(AneError::State {
                handle: program.0,
                call: "unload",
                state: e.state.name(),
            });
        }
        e.state = State::Unloaded;
        let bytes = e.exe.const_bytes;
        g.stats.loaded -= 1;
        g.stats.loaded_bytes = g.stats.loaded_bytes.saturating_sub(bytes);
        Ok(())
    }

    fn signature(&self, program: ProgramHandle) -> Result<Signature, AneError> {
        let mut g = self.lock();
        let e = Self::entry(&mut g, program)?;
        let sig = |v: &[(String, Vec<usize>)]| {
            v.iter()
                .map(|(_, s)| (s.get(1).copied().unwrap_or(0), s.get(3).copied().unwrap_or(0)))
                .collect()
        };
        Ok(Signature {
            inputs: sig(&e.exe.inputs),
            outputs: sig(&e.exe.outputs),
        })
    }
}

fn check_surfaces(
    what: &str,
    want: &[(String, Vec<usize>)],
    got: impl ExactSizeIterator<Item = (usize, usize)>,
) -> Result<(), AneError> {
    if got.len() != want.len() {
        return Err(AneError::Surfaces(format!(
            "the program has {} {what} surfaces, {} given",
            want.len(),
            got.len()
        )));
    }
    for ((name, shape), (c, w)) in want.iter().zip(got) {
        if shape.as_slice() != [1, c, 1, w] {
            return Err(AneError::Surfaces(format!(
                "{what} `{name}` is {shape:?} but the surface is [1, {c}, 1, {w}]; allocate it from signature()"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_refuse;

    #[test]
    fn refuse_list_is_semicolon_separated() {
        assert_eq!(
            parse_refuse(" xnorm ; ;constexpr_blockwise_shift_scale"),
            ["xnorm", "constexpr_blockwise_shift_scale"]
        );
        assert!(parse_refuse("").is_empty());
    }
}
