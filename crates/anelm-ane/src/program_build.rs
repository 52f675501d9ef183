//! From one kernel's f32 weights to loaded ANE programs on a device: the translation the ANE
//! backend applies to each kernel a model compiles. A matrix becomes one program or row chunks
//! ([`linear_chunk_rows`]); a SwiGLU FFN becomes the planner's split ([`plan_ffn`]); each program
//! is lowered, compiled through the compile cache and loaded. Running the programs (surface
//! packing, lane grouping, the chunks' `x ‖ acc` accumulation) is [`ProgramLayout::run`].
//!
//! **Fallbacks** ([`fallback`], issue 27 item 4). When the device refuses a program (compile or
//! load fails, or the smoke dispatch every loaded program gets on zeroed inputs fails, issue 37
//! item 2), the kernel is rebuilt in the next form instead of failing:
//! - an int8 program is retried in fp16 (per program);
//! - an FFN goes resadd (`swiglu_ffn_residual`) → plain (`swiglu_ffn`, residual added on the
//!   host) → chunked (`ffn_chunk`s with the on-ANE accumulator);
//! - a refused LM head is handed back ([`BuildError::Refused`]) for the caller to run on the CPU;
//! - projections have no fallback: the error says to use `--device cpu`.
//!
//! Each fallback is counted and kept ([`BuildCounters`]) and passed to the builder's hook (the
//! engine logs it). A form the device refused once is not compiled again for kernels of the same
//! shape (each failed compile costs compile budget on a Mac).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::apple::{Fallback, FfnForm, fallback};
use crate::cache::{CacheOutcome, CompileCache, compile_or_load, content_id};
use crate::device::{AneDevice, Releasing, compile_and_load, smoke_dispatch};
use crate::kernel::{AneKernel, WeightMode};
use crate::kernel_run::{LoadedProgram, ProgramLayout};
use crate::limits::Limits;
use crate::lower::{ffn_chunk_weights, lower};
use crate::plan::{KernelRole, linear_chunk_rows, plan_ffn};
use crate::rules::Rule;

/// One fallback of one kernel: the form the device refused, the form it runs in now, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelFallback {
    /// The kernel: its kind and first weight (`ffn model.layers.0.mlp.gate_proj.weight`).
    pub kernel: String,
    /// The refused form (`swiglu_ffn_residual int8`, `ffn resadd`, `lm_head on ane`).
    pub from: String,
    /// The form it runs in now (`swiglu_ffn_residual fp16`, `ffn plain`, `cpu`).
    pub to: String,
    /// The device's refusal.
    pub reason: String,
}

impl fmt::Display for KernelFallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} → {} ({})", self.kernel, self.from, self.to, self.reason)
    }
}

/// Why building a kernel's programs failed.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum BuildError {
    /// The device refused the form (compile or load failed), or it cannot fit the device; for a
    /// kernel with a fallback, the next form may work.
    #[error("{0}")]
    Refused(String),
    /// Not the device's refusal (weights that do not lower, a bug): no fallback applies.
    #[error("{0}")]
    Fatal(String),
    /// The process's compile budget is spent ([`Rule::CompileBudget`]). Not a refusal: no form
    /// is marked refused and no fallback runs; the same command run again loads the programs
    /// compiled so far from the compile cache and compiles the rest.
    #[error("{0}")]
    Budget(String),
}

/// How a model's compiles spread over processes under the device's per-process compile budget,
/// worked out before compiling from the number of programs the plan needs
/// ([`crate::Plan::kernel_count`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompileForecast {
    /// Programs the model needs.
    pub programs: usize,
    /// The device's budget and what this process has spent.
    pub budget: crate::device::CompileBudget,
}

impl CompileForecast {
    /// Whether this process can compile every program (when none is in the compile cache).
    pub fn fits(&self) -> bool {
        self.programs as u64 <= self.budget.remaining()
    }

    /// Runs of the same command a start with an empty compile cache takes: this process
    /// compiles what its budget has left, each later run a whole budget (programs compiled
    /// earlier load from the cache without compiling). A lower bound when forms are refused
    /// (a failed compile costs budget too); `None` when the budget is 0.
    pub fn runs(&self) -> Option<u64> {
        let first = self.budget.remaining();
        let rest = (self.programs as u64).saturating_sub(first);
        if rest == 0 {
            return Some(1);
        }
        (self.budget.max > 0).then(|| 1 + rest.div_ceil(self.budget.max))
    }
}

impl fmt::Display for CompileForecast {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.budget;
        write!(
            f,
            "this model needs {} ANE programs; a process may compile {} ({} left in this one; {} sets it, 0 turns \
             the budget off)",
            self.programs,
            b.max,
            b.remaining(),
            crate::apple::MAX_COMPILES_ENV
        )?;
        match self.runs() {
            Some(1) => Ok(()),
            Some(n) => write!(
                f,
                "; with an empty compile cache the first start takes {n} runs of the same command, each loading \
                 what the runs before compiled from the cache and compiling the rest"
            ),
            None => write!(f, "; nothing can be compiled: raise the budget"),
        }
    }
}

type Built<T> = Result<T, BuildError>;

/// What building cost so far, summed over every kernel of one builder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuildStats {
    /// Programs compiled and loaded.
    pub programs: u64,
    /// Of those, how many the compiler built (the rest were cache loads).
    pub compiled: u64,
    /// Programs loaded without compiling (compile-cache hits).
    pub cache_loads: u64,
    /// Host time spent lowering, compiling and loading.
    pub compile_time: Duration,
    /// Kernels that fell back to another form.
    pub fallbacks: u64,
}

/// The counters of a [`ProgramBuilder`], shareable with whoever reports them.
#[derive(Debug, Default)]
pub struct BuildCounters {
    programs: AtomicU64,
    compiled: AtomicU64,
    cache_loads: AtomicU64,
    compile_ns: AtomicU64,
    fallbacks: AtomicU64,
    events: Mutex<Vec<KernelFallback>>,
}

/// A lock whose data stays consistent even if a holder panicked (every update is one push or
/// insert).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl BuildCounters {
    /// Counters so far.
    pub fn stats(&self) -> BuildStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BuildStats {
            programs: get(&self.programs),
            compiled: get(&self.compiled),
            cache_loads: get(&self.cache_loads),
            compile_time: Duration::from_nanos(get(&self.compile_ns)),
            fallbacks: get(&self.fallbacks),
        }
    }

    /// Every fallback so far, in the order the kernels were built.
    pub fn fallbacks(&self) -> Vec<KernelFallback> {
        lock(&self.events).clone()
    }
}

/// Called with each fallback as it happens (the engine logs it).
pub type FallbackHook = Box<dyn Fn(&KernelFallback) + Send + Sync>;

/// Builds the programs of kernels on one device, in one weight mode, through one compile cache.
pub struct ProgramBuilder<D: AneDevice> {
    device: Arc<D>,
    weights: WeightMode,
    cache: Option<CompileCache>,
    counters: Arc<BuildCounters>,
    /// Forms the device refused, by kernel shape and weight mode: not compiled again.
    refused: Mutex<HashMap<(AneKernel, WeightMode), String>>,
    hook: Option<FallbackHook>,
    /// Programs the model needs, when the plan told ([`ProgramBuilder::expect_programs`]; 0: unknown).
    expected: AtomicU64,
}

/// The three FFN weights (f32, row-major) and their widths.
#[derive(Clone, Copy, Debug)]
pub struct FfnWeights<'a> {
    /// Gate projection `[inter, hidden]`.
    pub gate: &'a [f32],
    /// Up projection `[inter, hidden]`.
    pub up: &'a [f32],
    /// Down projection `[hidden, inter]`.
    pub down: &'a [f32],
    /// Model width.
    pub hidden: usize,
    /// FFN width (or, for one chunk, the chunk's rows).
    pub inter: usize,
}

impl<D: AneDevice> ProgramBuilder<D> {
    /// A builder for `device` storing weights as `weights`, with compile-cache markers in
    /// `cache` (`None`: no cache).
    pub fn new(device: Arc<D>, weights: WeightMode, cache: Option<CompileCache>) -> Self {
        ProgramBuilder {
            device,
            weights,
            cache,
            counters: Arc::new(BuildCounters::default()),
            refused: Mutex::new(HashMap::new()),
            hook: None,
            expected: AtomicU64::new(0),
        }
    }

    /// Say how many programs the model needs (the plan's [`crate::Plan::kernel_count`]) before
    /// building them. Returns the forecast when the device has a compile budget, so the caller
    /// can say up front how many runs a cold start takes; a budget error names the count too.
    pub fn expect_programs(&self, programs: usize) -> Option<CompileForecast> {
        self.expected.store(programs as u64, Ordering::Relaxed);
        self.device
            .compile_budget()
            .map(|budget| CompileForecast { programs, budget })
    }

    /// Call `hook` with every fallback.
    pub fn with_fallback_hook(mut self, hook: FallbackHook) -> Self {
        self.hook = Some(hook);
        self
    }

    /// The device.
    pub fn device(&self) -> &Arc<D> {
        &self.device
    }

    /// The counters (shared: they keep counting after the handle is taken).
    pub fn counters(&self) -> Arc<BuildCounters> {
        Arc::clone(&self.counters)
    }

    /// Lower, compile (through the cache) and load one program in `mode`. A device error is
    /// [`BuildError::Refused`]; a lowering error is fatal.
    fn attempt(&self, kernel: &AneKernel, weights: &[&[f32]], mode: WeightMode) -> Built<LoadedProgram> {
        let key = (kernel.clone(), mode);
        if let Some(r) = lock(&self.refused).get(&key) {
            return Err(BuildError::Refused(format!("refused earlier for the same shape: {r}")));
        }
        let start = Instant::now();
        let low = lower(kernel, weights, mode).map_err(|e| BuildError::Fatal(format!("{kernel}: {e}")))?;
        let text = low.mil_text();
        let dev = &*self.device;
        let id = match &self.cache {
            Some(_) => content_id(&dev.cache_salt(), &text, low.weights.iter()),
            None => String::new(),
        };
        // A program whose load fails is released by compile_and_load.
        let (handle, outcome) = match compile_or_load(
            self.cache.as_ref(),
            &id,
            || dev.load_without_compile(&text, &low.weights),
            || compile_and_load(dev, &text, &low.weights),
        ) {
            Ok(r) => r,
            Err(e) if e.rule() == Some(Rule::CompileBudget) => {
                // The process, not the form: nothing is marked refused and no fallback runs.
                let c = self.counters.stats();
                let expected = self.expected.load(Ordering::Relaxed);
                let of = if expected > 0 {
                    format!(" of the {expected} this model needs")
                } else {
                    String::new()
                };
                return Err(BuildError::Budget(format!(
                    "{kernel} {mode}: {e}. This process built {} programs{of} ({} compiled, {} loaded from the \
                     compile cache). The form is not refused: run the same command again and it resumes from the \
                     compile cache",
                    c.programs, c.compiled, c.cache_loads
                )));
            }
            Err(e) => {
                let reason = format!("{kernel} {mode}: {e}");
                // A full load budget is about the process, not the form: try the form again.
                if !matches!(e.rule(), Some(Rule::LoadBudget | Rule::LoadedBytes)) {
                    lock(&self.refused).insert(key, reason.clone());
                }
                return Err(BuildError::Refused(reason));
            }
        };
        // Every loaded program gets one dispatch on zeroed inputs: a program the device takes but
        // cannot evaluate is a refusal of this form, which the fallback chain handles here rather
        // than a failed generation later. (Its compile-cache marker stays: the next process loads
        // it without compiling and refuses it the same way, at no compile cost.)
        if let Err(e) = smoke_dispatch(dev, handle) {
            let _ = dev.release(handle);
            let reason = format!("{kernel} {mode}: compiled and loaded, but its first evaluation failed: {e}");
            lock(&self.refused).insert(key, reason.clone());
            return Err(BuildError::Refused(reason));
        }
        let c = &self.counters;
        c.programs.fetch_add(1, Ordering::Relaxed);
        if outcome == CacheOutcome::Loaded {
            c.cache_loads.fetch_add(1, Ordering::Relaxed);
        } else {
            c.compiled.fetch_add(1, Ordering::Relaxed);
        }
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        c.compile_ns.fetch_add(ns, Ordering::Relaxed);
        Ok(LoadedProgram {
            handle,
            weight_bytes: kernel.weight_bytes(mode) as u64,
            outputs: kernel.output_channels(),
            kernel: kernel.clone(),
        })
    }

    /// One program in the configured weight mode; an int8 program the device refuses is retried
    /// in fp16 (and the fallback recorded under `label`).
    fn program(&self, label: &str, kernel: AneKernel, weights: &[&[f32]]) -> Built<LoadedProgram> {
        let mode = self.weights;
        match self.attempt(&kernel, weights, mode) {
            Err(BuildError::Refused(reason)) if mode != WeightMode::Fp16 => {
                match self.attempt(&kernel, weights, WeightMode::Fp16) {
                    Ok(p) => {
                        let kind = kernel.kind();
                        self.record(label, format!("{kind} {mode}"), format!("{kind} fp16"), reason);
                        Ok(p)
                    }
                    Err(BuildError::Refused(r)) => Err(BuildError::Refused(format!("{reason}; in fp16: {r}"))),
                    Err(f) => Err(f),
                }
            }
            other => other,
        }
    }

    /// Count, keep and report one fallback of the kernel `label`.
    pub fn record(&self, label: &str, from: String, to: impl Into<String>, reason: String) {
        let f = KernelFallback {
            kernel: label.to_string(),
            from,
            to: to.into(),
            reason,
        };
        if let Some(hook) = &self.hook {
            hook(&f);
        }
        self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
        lock(&self.counters.events).push(f);
    }

    /// The final error for a refused kernel of `role` that has no (further) fallback.
    fn give_up(label: &str, failure: BuildError, role: &KernelRole, form: FfnForm) -> BuildError {
        match failure {
            BuildError::Fatal(e) => BuildError::Fatal(e),
            BuildError::Budget(e) => BuildError::Budget(format!("{label}: {e}")),
            BuildError::Refused(reason) => {
                let what = match fallback(role, form) {
                    Fallback::Abort(m) => m,
                    other => format!("no fallback applies here ({other:?}); run with --device cpu"),
                };
                BuildError::Refused(format!("{label}: {reason}; {what}"))
            }
        }
    }

    /// `W·x` for a `rows × cols` matrix: one program, or row chunks ([`AneKernel::LmHeadChunk`])
    /// when it is over the per-kernel limits. A refusal is returned as is (no fallback), so the
    /// caller decides: [`ProgramBuilder::linear`] gives up, an LM head runs on the CPU. On any
    /// failure the chunks already loaded are released.
    pub fn rows(&self, label: &str, rows: usize, cols: usize, data: &[f32]) -> Built<ProgramLayout> {
        let per = linear_chunk_rows(cols, &self.device.limits()).map_err(|e| BuildError::Refused(e.to_string()))?;
        if data.len() != rows * cols {
            return Err(BuildError::Fatal(format!(
                "{label}: {} weights for a {rows}×{cols} matrix",
                data.len()
            )));
        }
        let count = rows.div_ceil(per);
        let mut programs = Vec::with_capacity(count);
        // Releases the chunks already loaded if a later one fails.
        let mut guard = Releasing::new(&*self.device);
        for (index, start) in (0..rows).step_by(per).enumerate() {
            let n = per.min(rows - start);
            let (kernel, name) = if n == rows {
                (AneKernel::Linear { rows: n, cols }, label.to_string())
            } else {
                (
                    AneKernel::LmHeadChunk { rows: n, cols },
                    format!("{label} chunk {}/{count}", index + 1),
                )
            };
            let p = self.program(&name, kernel, &[&data[start * cols..(start + n) * cols]])?;
            guard.add(p.handle);
            programs.push(p);
        }
        guard.keep();
        Ok(ProgramLayout::Rows(programs))
    }

    /// [`ProgramBuilder::rows`] for a projection, which has no fallback.
    pub fn linear(&self, label: &str, rows: usize, cols: usize, data: &[f32]) -> Built<ProgramLayout> {
        self.rows(label, rows, cols, data)
            .map_err(|f| Self::give_up(label, f, &KernelRole::OutputProj, FfnForm::Residual))
    }

    /// `[W1·x ; W2·x ; …]`: matrices of `parts` rows each, all `cols` wide, as one program.
    pub fn fused(&self, label: &str, parts: Vec<usize>, cols: usize, data: &[&[f32]]) -> Built<ProgramLayout> {
        let p = self
            .program(label, AneKernel::FusedLinear { parts, cols }, data)
            .map_err(|f| Self::give_up(label, f, &KernelRole::InputProj, FfnForm::Residual))?;
        Ok(ProgramLayout::Rows(vec![p]))
    }

    /// `r + W·x` for a `rows × cols` matrix, as one program.
    pub fn linear_residual(&self, label: &str, rows: usize, cols: usize, data: &[f32]) -> Built<ProgramLayout> {
        let p = self
            .program(label, AneKernel::LinearResidual { rows, cols }, &[data])
            .map_err(|f| Self::give_up(label, f, &KernelRole::OutputProjResidual, FfnForm::Residual))?;
        Ok(ProgramLayout::Residual(p))
    }

    /// `x + D(silu(G·x) ⊙ U·x)`: the planner's split of the FFN (one resadd kernel, or chunks),
    /// falling back resadd → plain → chunked as the device refuses forms.
    pub fn ffn(&self, label: &str, w: &FfnWeights<'_>) -> Built<ProgramLayout> {
        let planned: Vec<AneKernel> = plan_ffn(w.hidden, w.inter, &self.device.limits())
            .map_err(|e| BuildError::Fatal(e.to_string()))?
            .into_iter()
            .map(|k| k.kernel)
            .collect();
        let mut form = if planned.len() == 1 {
            FfnForm::Residual
        } else {
            FfnForm::Chunked
        };
        loop {
            let reason = match self.ffn_form(label, form, w, &planned) {
                Ok(layout) => return Ok(layout),
                Err(BuildError::Refused(reason)) => reason,
                Err(e) => return Err(Self::give_up(label, e, &KernelRole::FfnResidual, form)),
            };
            let role = match form {
                FfnForm::Chunked => KernelRole::FfnChunk { index: 0, count: 1 },
                _ => KernelRole::FfnResidual,
            };
            match fallback(&role, form) {
                Fallback::Ffn(next) => {
                    self.record(label, format!("ffn {form}"), format!("ffn {next}"), reason);
                    form = next;
                }
                _ => return Err(Self::give_up(label, BuildError::Refused(reason), &role, form)),
            }
        }
    }

    /// One chunk of a split FFN (`w.inter` is the chunk's rows) with the on-ANE accumulator.
    pub fn ffn_chunk(&self, label: &str, w: &FfnWeights<'_>) -> Built<ProgramLayout> {
        let role = KernelRole::FfnChunk { index: 0, count: 1 };
        let p = self
            .program(
                label,
                AneKernel::FfnChunk {
                    hidden: w.hidden,
                    chunk: w.inter,
                },
                &[w.gate, w.up, w.down],
            )
            .map_err(|f| Self::give_up(label, f, &role, FfnForm::Chunked))?;
        Ok(ProgramLayout::Chunks(vec![p]))
    }

    /// The FFN in one form. `planned` is the planner's split.
    fn ffn_form(&self, label: &str, form: FfnForm, w: &FfnWeights<'_>, planned: &[AneKernel]) -> Built<ProgramLayout> {
        let (hidden, inter) = (w.hidden, w.inter);
        let all = [w.gate, w.up, w.down];
        match form {
            FfnForm::Residual => {
                let p = self.program(label, AneKernel::SwiGluFfnResidual { hidden, inter }, &all)?;
                Ok(ProgramLayout::Residual(p))
            }
            FfnForm::Plain => {
                let p = self.program(label, AneKernel::SwiGluFfn { hidden, inter }, &all)?;
                Ok(ProgramLayout::AddOnHost(p))
            }
            FfnForm::Chunked => {
                let split;
                let chunks = if planned.len() > 1 {
                    planned
                } else {
                    // Fits as one kernel but that was refused: the smallest split into ≥ 2 chunks.
                    let total = 3 * (hidden as u64) * (inter as u64) * 2;
                    let opts = Limits {
                        ffn_max_bytes: (total / 2).max(1),
                        ..self.device.limits()
                    };
                    split = plan_ffn(hidden, inter, &opts)
                        .map_err(|e| BuildError::Refused(format!("no chunked form: {e}")))?
                        .into_iter()
                        .map(|k| k.kernel)
                        .collect::<Vec<_>>();
                    &split
                };
                let count = chunks.len();
                let mut programs = Vec::with_capacity(count);
                let mut guard = Releasing::new(&*self.device);
                for (index, k) in chunks.iter().enumerate() {
                    let AneKernel::FfnChunk { chunk, .. } = *k else {
                        return Err(BuildError::Fatal(format!("the FFN plan gave {k}, expected chunks")));
                    };
                    let c = ffn_chunk_weights(w.gate, w.up, w.down, hidden, inter, index, chunk)
                        .map_err(|e| BuildError::Fatal(e.to_string()))?;
                    let name = format!("{label} chunk {}/{count}", index + 1);
                    let p = self.program(&name, k.clone(), &[&c.gate, &c.up, &c.down])?;
                    guard.add(p.handle);
                    programs.push(p);
                }
                guard.keep();
                Ok(ProgramLayout::Chunks(programs))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emu::{EmuAne, EmuConfig};

    fn builder(refuse: &[&str]) -> ProgramBuilder<EmuAne> {
        let cfg = EmuConfig {
            refuse: refuse.iter().map(|s| s.to_string()).collect(),
            ..EmuConfig::default()
        };
        ProgramBuilder::new(Arc::new(EmuAne::new(cfg)), WeightMode::Fp16, None)
    }

    fn weights(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) / 16.0).collect()
    }

    #[test]
    fn a_refused_resadd_ffn_falls_back_to_plain_and_is_recorded() {
        let b = builder(&["xnorm"]);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hook_seen = Arc::clone(&seen);
        let b = b.with_fallback_hook(Box::new(move |f: &KernelFallback| lock(&hook_seen).push(f.to_string())));
        let (h, f) = (64, 128);
        let (g, u, d) = (weights(f * h), weights(f * h), weights(h * f));
        let w = FfnWeights {
            gate: &g,
            up: &u,
            down: &d,
            hidden: h,
            inter: f,
        };
        let layout = b.ffn("ffn layer0", &w).expect("plain form");
        assert!(matches!(layout, ProgramLayout::AddOnHost(_)), "{layout:?}");
        let fallbacks = b.counters().fallbacks();
        assert_eq!(fallbacks.len(), 1);
        assert_eq!(
            (fallbacks[0].from.as_str(), fallbacks[0].to.as_str()),
            ("ffn resadd", "ffn plain")
        );
        assert_eq!(lock(&seen).len(), 1, "the hook saw the fallback");
        assert_eq!(b.counters().stats().programs, 1);
    }

    /// Issue 37 item 2: a program that compiles and loads but fails to evaluate is refused by its
    /// smoke dispatch, released, and the FFN falls back to the next form.
    #[test]
    fn a_resadd_ffn_that_fails_to_evaluate_falls_back_to_plain() {
        let cfg = EmuConfig {
            fail_evaluate: vec!["xnorm".into()],
            ..EmuConfig::default()
        };
        let dev = Arc::new(EmuAne::new(cfg));
        let b = ProgramBuilder::new(Arc::clone(&dev), WeightMode::Fp16, None);
        let (h, f) = (64, 128);
        let (g, u, d) = (weights(f * h), weights(f * h), weights(h * f));
        let w = FfnWeights {
            gate: &g,
            up: &u,
            down: &d,
            hidden: h,
            inter: f,
        };
        let layout = b.ffn("ffn layer0", &w).expect("plain form");
        assert!(matches!(layout, ProgramLayout::AddOnHost(_)), "{layout:?}");
        let fb = b.counters().fallbacks();
        assert_eq!(fb.len(), 1, "{fb:?}");
        assert!(fb[0].reason.contains("first evaluation failed"), "{}", fb[0].reason);
        let st = dev.stats();
        assert_eq!((st.compiles, st.loaded), (2, 1), "the failed program was released");
        assert_eq!(st.dispatches, 1, "the plain form's smoke dispatch");
    }

    #[test]
    fn a_refused_projection_gives_up_saying_what_to_do_and_a_refused_head_is_handed_back() {
        let b = builder(&["concat("]);
        let (q, k) = (weights(32 * 16), weights(16 * 16));
        let err = b
            .fused("concat q + k", vec![32, 16], 16, &[&q, &k])
            .expect_err("refused");
        let BuildError::Refused(msg) = err else {
            panic!("a refusal, not {err:?}");
        };
        assert!(
            msg.starts_with("concat q + k: ") && msg.contains("--device cpu"),
            "{msg}"
        );
        // A matrix refusal from `rows` is returned as is: the caller picks the LM head's fallback.
        let b = builder(&["conv("]);
        let m = weights(8 * 16);
        match b.rows("lm_head", 8, 16, &m) {
            Err(BuildError::Refused(msg)) => assert!(!msg.contains("--device cpu"), "{msg}"),
            other => panic!("expected a bare refusal, got {other:?}"),
        }
        assert!(b.counters().fallbacks().is_empty());
    }
}
