//! The ANE backend over any [`AneDevice`] (the real Neural Engine or the emulator): a thin
//! adapter from the engine's `KernelSpec` / `Kernel` / `Batch` to anelm-ane. Each spec's weights
//! are dequantised to f32 and handed to [`ProgramBuilder`] (`anelm_ane::program_build`), which
//! turns them into the planner's ANE programs — row chunks, fused projections, the FFN's split
//! and its fallback chain (int8 → fp16; resadd → plain → chunked) — compiled through the compile
//! cache and kept loaded; a run hands the `Batch` lanes to [`ProgramLayout::run`], which packs up
//! to 32 lanes into each fp16 surface (more lanes take several dispatch groups), evaluates, and
//! unpacks.
//!
//! What stays here is what needs the engine: reading the weights from the `TensorStore`, the LM
//! head's fallback to the CPU backend when the device refuses it, and the dispatch counters
//! behind [`AneMonitor`]. Each fallback is logged (`tracing` warning), counted in
//! [`AneStats::fallbacks`] and listed by [`AneMonitor::fallbacks`] (`anelm bench` and
//! `anelm doctor` print them).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use anelm_ane::KernelFallback;
use anelm_ane::{
    AneDevice, BuildCounters, BuildError, CompileCache, FfnWeights, LANES, ProgramBuilder, ProgramLayout, WeightMode,
};
use anelm_model::tensor_store::TensorStore;

use crate::backend::{Backend, Dispatch, Kernel, KernelShape, KernelSpec, WeightId};
use crate::batch::Batch;
use crate::cpu_backend::CpuBackend;
use crate::error::{EngineError, Result, check_matrix_shape};
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

/// What the kernels' runs cost so far.
#[derive(Debug, Default)]
struct RunCounters {
    dispatches: AtomicU64,
    bytes: AtomicU64,
    host_ns: AtomicU64,
    ane_ns: AtomicU64,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The counters of an [`AneBackend`] and of every kernel it compiled.
#[derive(Clone, Debug)]
pub struct AneMonitor {
    build: Arc<BuildCounters>,
    runs: Arc<RunCounters>,
}

impl AneMonitor {
    /// Counters so far.
    pub fn stats(&self) -> AneStats {
        let b = self.build.stats();
        let r = &self.runs;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        AneStats {
            programs: b.programs,
            compiled: b.compiled,
            cache_loads: b.cache_loads,
            compile_time: b.compile_time,
            dispatches: get(&r.dispatches),
            bytes: get(&r.bytes),
            host_time: Duration::from_nanos(get(&r.host_ns)),
            ane_time: Duration::from_nanos(get(&r.ane_ns)),
            fallbacks: b.fallbacks,
        }
    }

    /// Every fallback so far, in the order the kernels were built.
    pub fn fallbacks(&self) -> Vec<KernelFallback> {
        self.build.fallbacks()
    }

    /// Zero the dispatch counters and clocks (compile counters stay).
    pub fn reset_dispatch_stats(&self) {
        let r = &self.runs;
        for a in [&r.dispatches, &r.bytes, &r.host_ns, &r.ane_ns] {
            a.store(0, Ordering::Relaxed);
        }
    }
}

/// Kernels on a Neural Engine device.
pub struct AneBackend<D: AneDevice> {
    builder: ProgramBuilder<D>,
    opts: AneOptions,
    runs: Arc<RunCounters>,
    /// Where a refused LM head runs.
    cpu: CpuBackend,
}

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
        let name = device.name().to_string();
        let builder = ProgramBuilder::new(device, opts.weights, opts.cache.clone()).with_fallback_hook(Box::new(
            move |f: &KernelFallback| tracing::warn!(device = name.as_str(), "ANE fallback: {f}"),
        ));
        AneBackend {
            builder,
            opts,
            runs: Arc::new(RunCounters::default()),
            cpu: CpuBackend::new(),
        }
    }

    /// The device.
    pub fn device(&self) -> &Arc<D> {
        self.builder.device()
    }

    /// Say how many programs the model needs (the plan's count) before compiling it; warns when
    /// the device's per-process compile budget cannot build them all in this process (the
    /// next run resumes from the compile cache). Returns the forecast, if the device has a budget.
    pub fn expect_programs(&self, programs: usize) -> Option<anelm_ane::CompileForecast> {
        let f = self.builder.expect_programs(programs)?;
        if !f.fits() {
            tracing::warn!(device = self.device().name(), "ANE compile budget: {f}");
        }
        Some(f)
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
        AneMonitor {
            build: self.builder.counters(),
            runs: Arc::clone(&self.runs),
        }
    }

    fn err(&self, message: impl Into<String>) -> EngineError {
        EngineError::Backend {
            backend: self.device().name().to_string(),
            message: message.into(),
        }
    }

    /// A build failure as the load's error.
    fn failed(&self, e: BuildError) -> EngineError {
        self.err(e.to_string())
    }

    fn kernel(&self, shape: KernelShape, layout: ProgramLayout) -> Box<dyn Kernel> {
        Box::new(AneRun {
            device: Arc::clone(self.device()),
            runs: Arc::clone(&self.runs),
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
    check_matrix_shape(&d.name, (d.rows, d.cols), (rows, cols))
}

/// The FFN's three matrices, their shapes checked against the gate's.
fn ffn_weights(store: &Arc<dyn TensorStore>, gate: &WeightId, up: &WeightId, down: &WeightId) -> Result<[Dense; 3]> {
    let (g, u, d) = (dense(store, gate)?, dense(store, up)?, dense(store, down)?);
    expect(&u, g.rows, g.cols)?;
    expect(&d, g.cols, g.rows)?;
    Ok([g, u, d])
}

impl<D: AneDevice + 'static> Backend for AneBackend<D> {
    fn name(&self) -> &str {
        self.device().name()
    }

    fn max_lanes(&self) -> usize {
        LANES
    }

    fn compile(&self, spec: &KernelSpec, weights: &Arc<dyn TensorStore>) -> Result<Box<dyn Kernel>> {
        let label = spec_label(spec);
        let b = &self.builder;
        match spec {
            KernelSpec::Linear { w } => {
                let m = dense(weights, w)?;
                let layout = b.linear(&label, m.rows, m.cols, &m.data).map_err(|e| self.failed(e))?;
                Ok(self.kernel(
                    KernelShape {
                        input: m.cols,
                        output: m.rows,
                    },
                    layout,
                ))
            }
            KernelSpec::LmHead { w } => {
                let m = dense(weights, w)?;
                let shape = KernelShape {
                    input: m.cols,
                    output: m.rows,
                };
                match b.rows(&label, m.rows, m.cols, &m.data) {
                    Ok(layout) => Ok(self.kernel(shape, layout)),
                    // A spent compile budget is not a refusal: the LM head stays on the ANE next run.
                    Err(e @ (BuildError::Fatal(_) | BuildError::Budget(_))) => Err(self.failed(e)),
                    Err(BuildError::Refused(reason)) => {
                        drop(m);
                        // Every chunk is already released (the builder's guard).
                        let k = self.cpu.compile(spec, weights)?;
                        b.record(&label, format!("lm_head on {}", self.device().name()), "cpu", reason);
                        Ok(k)
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
                let layout = b.fused(&label, parts, cols, &data).map_err(|e| self.failed(e))?;
                Ok(self.kernel(KernelShape { input: cols, output }, layout))
            }
            KernelSpec::LinearResidual { w } => {
                let m = dense(weights, w)?;
                let layout = b
                    .linear_residual(&label, m.rows, m.cols, &m.data)
                    .map_err(|e| self.failed(e))?;
                Ok(self.kernel(
                    KernelShape {
                        input: m.cols,
                        output: m.rows,
                    },
                    layout,
                ))
            }
            KernelSpec::SwiGluResidual { gate, up, down } | KernelSpec::SwiGluAccumulate { gate, up, down } => {
                let [g, u, d] = ffn_weights(weights, gate, up, down)?;
                let w = FfnWeights {
                    gate: &g.data,
                    up: &u.data,
                    down: &d.data,
                    hidden: g.cols,
                    inter: g.rows,
                };
                let layout = if matches!(spec, KernelSpec::SwiGluResidual { .. }) {
                    b.ffn(&label, &w)
                } else {
                    b.ffn_chunk(&label, &w)
                }
                .map_err(|e| self.failed(e))?;
                Ok(self.kernel(
                    KernelShape {
                        input: g.cols,
                        output: g.cols,
                    },
                    layout,
                ))
            }
        }
    }
}

struct AneRun<D: AneDevice> {
    device: Arc<D>,
    runs: Arc<RunCounters>,
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
        let c = &self.runs;
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
            // Not counted here: a Neural Engine figure is its modelled time, not a CPU unit's rate.
            macs: 0,
            unit: None,
        })
    }
}
