//! The ANE backend over any [`AneDevice`] (the real Neural Engine or the emulator): each
//! `KernelSpec` becomes the planner's ANE kernels (`anelm_ane::plan_ffn`,
//! `anelm_ane::linear_chunk_rows`), lowered to MIL text + weight blobs, compiled through the
//! compile cache and kept loaded. A run packs up to 32 `Batch` lanes into each fp16
//! `[1, C, 1, 32]` surface (more lanes take several dispatch groups), evaluates, and unpacks.
//!
//! **Fallbacks** (`anelm_ane::fallback`, issue 27 item 4). When the device refuses a program
//! (compile or load fails), the kernel is rebuilt in the next form instead of failing the load:
//! - an int8 program is retried in fp16 (per program);
//! - an FFN goes resadd (`swiglu_ffn_residual`) → plain (`swiglu_ffn`, residual added on the
//!   host) → chunked (`ffn_chunk`s with the on-ANE accumulator);
//! - the LM head runs on the CPU (the CPU backend's kernel for the same spec);
//! - projections have no fallback: the load fails with a message that says to use `--device cpu`.
//!
//! Each fallback is logged (`tracing` warning), counted in [`AneStats::fallbacks`] and listed by
//! [`AneMonitor::fallbacks`] (`anelm bench` and `anelm doctor` print them). A form the device
//! refused once is not compiled again for kernels of the same shape (each failed compile costs
//! compile budget on a Mac).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anelm_ane::{
    AneDevice, AneKernel, CacheOutcome, CompileCache, Fallback, FfnForm, KernelRole, LANES, Limits, LoadedProgram,
    ProgramLayout, Releasing, Rule, WeightMode, compile_and_load, compile_or_load, content_id, fallback,
    ffn_chunk_weights, linear_chunk_rows, lower, plan_ffn,
};
use anelm_model::tensor_store::TensorStore;

use crate::backend::{Backend, Dispatch, Kernel, KernelShape, KernelSpec, WeightId};
use crate::batch::Batch;
use crate::cpu_backend::CpuBackend;
use crate::error::{EngineError, Result};
use crate::stored_matrix::StoredMatrix;

/// How the ANE backend builds its programs.
#[derive(Clone, Debug, PartialEq)]
pub struct AneOptions {
    /// Weight storage in the programs (fp16, or int8 rows with fp16 scales).
    pub weights: WeightMode,
    /// Compile-cache markers (`None`: `--no-ane-cache`).
    pub cache: Option<CompileCache>,
}

impl Default for AneOptions {
    fn default() -> Self {
        AneOptions {
            weights: WeightMode::Fp16,
            cache: None,
        }
    }
}

/// Counters of one ANE backend, summed over all its kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AneStats {
    /// Programs compiled and loaded (one per ANE kernel).
    pub programs: u64,
    /// Of those, how many the compiler built (the rest were cache loads).
    pub compiled: u64,
    /// Programs loaded without compiling (compile-cache hits).
    pub cache_loads: u64,
    /// Host time spent lowering, compiling and loading.
    pub compile_time: Duration,
    /// Device evaluations.
    pub dispatches: u64,
    /// Bytes the evaluations moved (weights + surfaces).
    pub bytes: u64,
    /// Host wall time of the evaluations (packing included).
    pub host_time: Duration,
    /// Modelled (emulator) or measured (hardware) Neural Engine time of the evaluations.
    pub ane_time: Duration,
    /// Kernels that fell back to another form (int8 → fp16, FFN resadd → plain → chunked, LM
    /// head → CPU); [`AneMonitor::fallbacks`] lists them.
    pub fallbacks: u64,
}

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

#[derive(Debug, Default)]
struct Counters {
    programs: AtomicU64,
    compiled: AtomicU64,
    cache_loads: AtomicU64,
    compile_ns: AtomicU64,
    dispatches: AtomicU64,
    bytes: AtomicU64,
    host_ns: AtomicU64,
    ane_ns: AtomicU64,
    fallbacks: AtomicU64,
    events: Mutex<Vec<KernelFallback>>,
}

/// A lock whose data stays consistent even if a holder panicked (every update is one push or
/// insert).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The counters of an [`AneBackend`] and of every kernel it compiled.
#[derive(Clone, Debug)]
pub struct AneMonitor(Arc<Counters>);

impl AneMonitor {
    /// Counters so far.
    pub fn stats(&self) -> AneStats {
        let c = &self.0;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        AneStats {
            programs: get(&c.programs),
            compiled: get(&c.compiled),
            cache_loads: get(&c.cache_loads),
            compile_time: Duration::from_nanos(get(&c.compile_ns)),
            dispatches: get(&c.dispatches),
            bytes: get(&c.bytes),
            host_time: Duration::from_nanos(get(&c.host_ns)),
            ane_time: Duration::from_nanos(get(&c.ane_ns)),
            fallbacks: get(&c.fallbacks),
        }
    }

    /// Every fallback so far, in the order the kernels were built.
    pub fn fallbacks(&self) -> Vec<KernelFallback> {
        lock(&self.0.events).clone()
    }

    /// Zero the dispatch counters and clocks (compile counters stay).
    pub fn reset_dispatch_stats(&self) {
        let c = &self.0;
        for a in [&c.dispatches, &c.bytes, &c.host_ns, &c.ane_ns] {
            a.store(0, Ordering::Relaxed);
        }
    }
}

/// Kernels on a Neural Engine device.
pub struct AneBackend<D: AneDevice> {
    device: Arc<D>,
    opts: AneOptions,
    counters: Arc<Counters>,
    /// Where a refused LM head runs.
    cpu: CpuBackend,
    /// Forms the device refused, by kernel shape and weight mode: not compiled again.
    refused: Mutex<HashMap<(AneKernel, WeightMode), String>>,
}

/// Why building a kernel form failed.
enum Failure {
    /// Not the device's refusal (bad weights, a bug): no fallback applies.
    Fatal(EngineError),
    /// The device refused the form (compile or load failed), or it cannot fit the device: the
    /// next form may work.
    Refused(String),
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Self {
        Failure::Fatal(e)
    }
}

type Built<T> = std::result::Result<T, Failure>;

/// A short name for a spec in fallback reports and errors: its kind and first weight.
fn spec_label(spec: &KernelSpec) -> String {
    match spec {
        KernelSpec::Linear { w } => format!("linear {}", w.0),
        KernelSpec::LmHead { w } => format!("lm_head {}", w.0),
        KernelSpec::Concat { ws } => {
            let names: Vec<&str> = ws.iter().map(|w| w.0.as_str()).collect();
            format!("concat {}", names.join(" + "))
        }
        KernelSpec::LinearResidual { w } => format!("linear_residual {}", w.0),
        KernelSpec::SwiGluResidual { gate, .. } => format!("ffn {}", gate.0),
        KernelSpec::SwiGluAccumulate { gate, .. } => format!("ffn_chunk {}", gate.0),
    }
}

impl<D: AneDevice + 'static> AneBackend<D> {
    /// A backend that compiles onto `device`.
    pub fn new(device: Arc<D>, opts: AneOptions) -> Self {
        AneBackend {
            device,
            opts,
            counters: Arc::new(Counters::default()),
            cpu: CpuBackend::new(),
            refused: Mutex::new(HashMap::new()),
        }
    }

    /// The device.
    pub fn device(&self) -> &Arc<D> {
        &self.device
    }

    /// The options.
    pub fn options(&self) -> &AneOptions {
        &self.opts
    }

    /// Counters so far.
    pub fn stats(&self) -> AneStats {
        self.monitor().stats()
    }

    /// Zero the dispatch counters and clocks (compile counters stay).
    pub fn reset_dispatch_stats(&self) {
        self.monitor().reset_dispatch_stats();
    }

    /// A handle on this backend's counters that outlives the backend (kernels keep counting).
    pub fn monitor(&self) -> AneMonitor {
        AneMonitor(Arc::clone(&self.counters))
    }

    fn err(&self, message: impl Into<String>) -> EngineError {
        EngineError::Backend {
            backend: self.device.name().to_string(),
            message: message.into(),
        }
    }

    /// Lower, compile (through the cache) and load one ANE program in `mode`. A device error is
    /// a [`Failure::Refused`]; a lowering error is fatal.
    fn attempt(&self, kernel: &AneKernel, weights: &[&[f32]], mode: WeightMode) -> Built<LoadedProgram> {
        let key = (kernel.clone(), mode);
        if let Some(r) = lock(&self.refused).get(&key) {
            return Err(Failure::Refused(format!("refused earlier for the same shape: {r}")));
        }
        let start = Instant::now();
        let low = lower(kernel, weights, mode).map_err(|e| self.err(format!("{kernel}: {e}")))?;
        let text = low.mil_text();
        let dev = &*self.device;
        let id = match &self.opts.cache {
            Some(_) => content_id(&dev.cache_salt(), &text, low.weights.iter()),
            None => String::new(),
        };
        // A program whose load fails is released by compile_and_load.
        let (handle, outcome) = match compile_or_load(
            self.opts.cache.as_ref(),
            &id,
            || dev.load_without_compile(&text, &low.weights),
            || compile_and_load(dev, &text, &low.weights),
        ) {
            Ok(r) => r,
            Err(e) => {
                let reason = format!("{kernel} {mode}: {e}");
                // A full load budget is about the process, not the form: try the form again.
                if !matches!(e.rule(), Some(Rule::LoadBudget | Rule::LoadedBytes)) {
                    lock(&self.refused).insert(key, reason.clone());
                }
                return Err(Failure::Refused(reason));
            }
        };
        let c = &self.counters;
        c.programs.fetch_add(1, Ordering::Relaxed);
        if outcome == CacheOutcome::Loaded {
            c.cache_loads.fetch_add(1, Ordering::Relaxed);
        } else {
            c.compiled.fetch_add(1, Ordering::Relaxed);
        }
        c.compile_ns.fetch_add(ns(start.elapsed()), Ordering::Relaxed);
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
        let mode = self.opts.weights;
        match self.attempt(&kernel, weights, mode) {
            Err(Failure::Refused(reason)) if mode != WeightMode::Fp16 => {
                match self.attempt(&kernel, weights, WeightMode::Fp16) {
                    Ok(p) => {
                        let kind = kernel.kind();
                        self.record(label, format!("{kind} {mode}"), format!("{kind} fp16"), reason);
                        Ok(p)
                    }
                    Err(Failure::Refused(r)) => Err(Failure::Refused(format!("{reason}; in fp16: {r}"))),
                    Err(f) => Err(f),
                }
            }
            other => other,
        }
    }

    /// Count, keep and log one fallback.
    fn record(&self, kernel: &str, from: String, to: impl Into<String>, reason: String) {
        let f = KernelFallback {
            kernel: kernel.to_string(),
            from,
            to: to.into(),
            reason,
        };
        tracing::warn!(device = self.device.name(), "ANE fallback: {f}");
        self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
        lock(&self.counters.events).push(f);
    }

    /// The load error for a refused kernel that has no fallback (`role` picks the message).
    fn give_up(&self, label: &str, failure: Failure, role: &KernelRole, form: FfnForm) -> EngineError {
        match failure {
            Failure::Fatal(e) => e,
            Failure::Refused(reason) => {
                let what = match fallback(role, form) {
                    Fallback::Abort(m) => m,
                    other => format!("no fallback applies here ({other:?}); run with --device cpu"),
                };
                self.err(format!("{label}: {reason}; {what}"))
            }
        }
    }

    /// A linear layer as row chunks (`LmHeadChunk`s when more than one). On any failure the
    /// chunks already loaded are released.
    fn rows(&self, label: &str, m: &Dense) -> Built<Vec<LoadedProgram>> {
        let per = linear_chunk_rows(m.cols, &self.device.limits()).map_err(|e| Failure::Refused(e.to_string()))?;
        let count = m.rows.div_ceil(per);
        let mut programs = Vec::with_capacity(count);
        // Releases the chunks already loaded if a later one fails.
        let mut guard = Releasing::new(&*self.device);
        for (index, start) in (0..m.rows).step_by(per).enumerate() {
            let rows = per.min(m.rows - start);
            let (kernel, name) = if rows == m.rows {
                (AneKernel::Linear { rows, cols: m.cols }, label.to_string())
            } else {
                (
                    AneKernel::LmHeadChunk { rows, cols: m.cols },
                    format!("{label} chunk {}/{count}", index + 1),
                )
            };
            let part = &m.data[start * m.cols..(start + rows) * m.cols];
            let p = self.program(&name, kernel, &[part])?;
            guard.add(p.handle);
            programs.push(p);
        }
        guard.keep();
        Ok(programs)
    }

    /// The FFN `x + D(silu(G·x) ⊙ U·x)` in one form. `planned` is the planner's split.
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
                        .map_err(|e| Failure::Refused(format!("no chunked form: {e}")))?
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
                        return Err(self.err(format!("the FFN plan gave {k}, expected chunks")).into());
                    };
                    let c = ffn_chunk_weights(w.gate, w.up, w.down, hidden, inter, index, chunk)
                        .map_err(|e| self.err(e.to_string()))?;
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

    fn kernel(&self, shape: KernelShape, layout: ProgramLayout) -> Box<dyn Kernel> {
        Box::new(AneRun {
            device: Arc::clone(&self.device),
            counters: Arc::clone(&self.counters),
            shape,
            layout,
        })
    }
}

/// A weight dequantised to f32, with its shape.
struct Dense {
    name: String,
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

fn dense(store: &Arc<dyn TensorStore>, id: &WeightId) -> Result<Dense> {
    let m = StoredMatrix::load(store, &id.0)?;
    Ok(Dense {
        data: m.to_f32()?,
        name: m.name,
        rows: m.rows,
        cols: m.cols,
    })
}

fn expect(d: &Dense, rows: usize, cols: usize) -> Result<()> {
    if d.rows == rows && d.cols == cols {
        Ok(())
    } else {
        Err(EngineError::TensorShape {
            name: d.name.clone(),
            found: vec![d.rows, d.cols],
            expected: vec![rows, cols],
        })
    }
}

impl<D: AneDevice + 'static> Backend for AneBackend<D> {
    fn name(&self) -> &str {
        self.device.name()
    }

    fn max_lanes(&self) -> usize {
        LANES
    }

    fn compile(&self, spec: &KernelSpec, weights: &Arc<dyn TensorStore>) -> Result<Box<dyn Kernel>> {
        let label = spec_label(spec);
        match spec {
            KernelSpec::Linear { w } => {
                let m = dense(weights, w)?;
                let programs = self
                    .rows(&label, &m)
                    .map_err(|f| self.give_up(&label, f, &KernelRole::OutputProj, FfnForm::Residual))?;
                let shape = KernelShape {
                    input: m.cols,
                    output: m.rows,
                };
                Ok(self.kernel(shape, ProgramLayout::Rows(programs)))
            }
            KernelSpec::LmHead { w } => {
                let m = dense(weights, w)?;
                let shape = KernelShape {
                    input: m.cols,
                    output: m.rows,
                };
                match self.rows(&label, &m) {
                    Ok(programs) => Ok(self.kernel(shape, ProgramLayout::Rows(programs))),
                    Err(Failure::Fatal(e)) => Err(e),
                    Err(Failure::Refused(reason)) => {
                        let role = KernelRole::LmHead { index: 0, count: 1 };
                        match fallback(&role, FfnForm::Residual) {
                            Fallback::LmHeadOnCpu => {
                                drop(m);
                                // Every chunk is already released (the guard in `rows`).
                                let k = self.cpu.compile(spec, weights)?;
                                let from = format!("lm_head on {}", self.device.name());
                                self.record(&label, from, "cpu", reason);
                                Ok(k)
                            }
                            _ => Err(self.give_up(&label, Failure::Refused(reason), &role, FfnForm::Residual)),
                        }
                    }
                }
            }
            KernelSpec::Concat { ws } => {
                let mats = ws.iter().map(|w| dense(weights, w)).collect::<Result<Vec<_>>>()?;
                let first = mats
                    .first()
                    .ok_or_else(|| EngineError::Config("a Concat kernel needs at least one matrix".into()))?;
                let cols = first.cols;
                if let Some(m) = mats.iter().find(|m| m.cols != cols) {
                    return Err(EngineError::Config(format!(
                        "fused matrices disagree on input width: '{}' has {cols} columns, '{}' has {}",
                        first.name, m.name, m.cols
                    )));
                }
                let parts: Vec<usize> = mats.iter().map(|m| m.rows).collect();
                let output = parts.iter().sum();
                let data: Vec<&[f32]> = mats.iter().map(|m| m.data.as_slice()).collect();
                let p = self
                    .program(&label, AneKernel::FusedLinear { parts, cols }, &data)
                    .map_err(|f| self.give_up(&label, f, &KernelRole::InputProj, FfnForm::Residual))?;
                Ok(self.kernel(KernelShape { input: cols, output }, ProgramLayout::Rows(vec![p])))
            }
            KernelSpec::LinearResidual { w } => {
                let m = dense(weights, w)?;
                let (rows, cols) = (m.rows, m.cols);
                let p = self
                    .program(&label, AneKernel::LinearResidual { rows, cols }, &[&m.data])
                    .map_err(|f| self.give_up(&label, f, &KernelRole::OutputProjResidual, FfnForm::Residual))?;
                Ok(self.kernel(
                    KernelShape {
                        input: cols,
                        output: rows,
                    },
                    ProgramLayout::Residual(p),
                ))
            }
            KernelSpec::SwiGluResidual { gate, up, down } => {
                let (g, u, d) = (dense(weights, gate)?, dense(weights, up)?, dense(weights, down)?);
                let (inter, hidden) = (g.rows, g.cols);
                expect(&u, inter, hidden)?;
                expect(&d, hidden, inter)?;
                let shape = KernelShape {
                    input: hidden,
                    output: hidden,
                };
                let planned: Vec<AneKernel> = plan_ffn(hidden, inter, &self.device.limits())
                    .map_err(|e| self.err(e.to_string()))?
                    .into_iter()
                    .map(|k| k.kernel)
                    .collect();
                let w = FfnWeights {
                    gate: &g.data,
                    up: &u.data,
                    down: &d.data,
                    hidden,
                    inter,
                };
                let mut form = if planned.len() == 1 {
                    FfnForm::Residual
                } else {
                    FfnForm::Chunked
                };
                loop {
                    let reason = match self.ffn_form(&label, form, &w, &planned) {
                        Ok(layout) => return Ok(self.kernel(shape, layout)),
                        Err(Failure::Fatal(e)) => return Err(e),
                        Err(Failure::Refused(reason)) => reason,
                    };
                    let role = match form {
                        FfnForm::Chunked => KernelRole::FfnChunk { index: 0, count: 1 },
                        _ => KernelRole::FfnResidual,
                    };
                    match fallback(&role, form) {
                        Fallback::Ffn(next) => {
                            self.record(&label, format!("ffn {form}"), format!("ffn {next}"), reason);
                            form = next;
                        }
                        _ => return Err(self.give_up(&label, Failure::Refused(reason), &role, form)),
                    }
                }
            }
            KernelSpec::SwiGluAccumulate { gate, up, down } => {
                let (g, u, d) = (dense(weights, gate)?, dense(weights, up)?, dense(weights, down)?);
                let (chunk, hidden) = (g.rows, g.cols);
                expect(&u, chunk, hidden)?;
                expect(&d, hidden, chunk)?;
                let role = KernelRole::FfnChunk { index: 0, count: 1 };
                let p = self
                    .program(
                        &label,
                        AneKernel::FfnChunk { hidden, chunk },
                        &[&g.data, &u.data, &d.data],
                    )
                    .map_err(|f| self.give_up(&label, f, &role, FfnForm::Chunked))?;
                Ok(self.kernel(
                    KernelShape {
                        input: hidden,
                        output: hidden,
                    },
                    ProgramLayout::Chunks(vec![p]),
                ))
            }
        }
    }
}

/// The three FFN weights (f32, row-major) and their widths.
struct FfnWeights<'a> {
    gate: &'a [f32],
    up: &'a [f32],
    down: &'a [f32],
    hidden: usize,
    inter: usize,
}

struct AneRun<D: AneDevice> {
    device: Arc<D>,
    counters: Arc<Counters>,
    shape: KernelShape,
    layout: ProgramLayout,
}

impl<D: AneDevice> Drop for AneRun<D> {
    fn drop(&mut self) {
        for p in self.layout.programs() {
            // Unloads the program and frees its request, surfaces and model; nothing to do if it
            // fails.
            let _ = self.device.release(p.handle);
        }
    }
}

impl<D: AneDevice> AneRun<D> {
    fn err(&self, message: impl Into<String>) -> EngineError {
        EngineError::Backend {
            backend: self.device.name().to_string(),
            message: message.into(),
        }
    }

    fn inputs<'a>(&self, inputs: &[&'a Batch]) -> Result<(&'a Batch, Option<&'a Batch>)> {
        let x = *inputs.first().ok_or_else(|| self.err("kernel run without an input"))?;
        if x.channels() != self.shape.input {
            return Err(self.err(format!(
                "input has {} channels, kernel takes {}",
                x.channels(),
                self.shape.input
            )));
        }
        if !self.layout.takes_residual() {
            return Ok((x, None));
        }
        let r = *inputs.get(1).ok_or_else(|| self.err("residual kernel run without r"))?;
        if r.channels() != self.shape.output || r.lanes() != x.lanes() {
            return Err(self.err(format!(
                "residual is {}×{}, expected {}×{}",
                r.lanes(),
                r.channels(),
                x.lanes(),
                self.shape.output
            )));
        }
        Ok((x, Some(r)))
    }
}

impl<D: AneDevice> Kernel for AneRun<D> {
    fn shape(&self) -> KernelShape {
        self.shape
    }

    fn run(&self, inputs: &[&Batch], out: &mut Batch) -> Result<Dispatch> {
        let start_time = Instant::now();
        let (x, r) = self.inputs(inputs)?;
        let lanes = x.lanes();
        out.resize(lanes, self.shape.output);
        let cost = self
            .layout
            .run(
                &*self.device,
                self.shape.input,
                self.shape.output,
                lanes,
                x.as_slice(),
                r.map(Batch::as_slice),
                out.as_mut_slice(),
            )
            .map_err(|e| self.err(e.to_string()))?;
        let elapsed = start_time.elapsed();
        let c = &self.counters;
        c.dispatches.fetch_add(cost.dispatches, Ordering::Relaxed);
        c.bytes.fetch_add(cost.bytes, Ordering::Relaxed);
        c.host_ns.fetch_add(ns(elapsed), Ordering::Relaxed);
        c.ane_ns.fetch_add(ns(cost.ane), Ordering::Relaxed);
        Ok(Dispatch {
            lanes,
            weight_bytes: cost.weight_bytes,
            activation_bytes: cost.activation_bytes(),
            elapsed,
            modelled: (cost.dispatches > 0).then_some(cost.ane),
        })
    }
}
