//! The ANE backend over any [`AneDevice`] (the real Neural Engine or the emulator): each
//! `KernelSpec` becomes the planner's ANE kernels (`anelm_ane::plan_ffn`,
//! `anelm_ane::linear_chunk_rows`), lowered to MIL text + weight blobs, compiled through the
//! compile cache and kept loaded. A run packs up to 32 `Batch` lanes into each fp16
//! `[1, C, 1, 32]` surface (more lanes take several dispatch groups), evaluates, and unpacks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anelm_ane::{
    AneDevice, AneKernel, CacheOutcome, CompileCache, LANES, PlanOptions, ProgramHandle, Releasing, Surface,
    WeightMode, compile_and_load, compile_or_load, content_id, ffn_chunk_weights, linear_chunk_rows, lower, plan_ffn,
};
use anelm_model::tensor_store::TensorStore;

use crate::backend::{Backend, Dispatch, Kernel, KernelShape, KernelSpec, WeightId};
use crate::batch::Batch;
use crate::error::{EngineError, Result};
use crate::stored_matrix::StoredMatrix;

/// How the ANE backend builds its programs.
#[derive(Clone, Debug, PartialEq)]
pub struct AneOptions {
    /// Weight storage in the programs (fp16, or int8 rows with fp16 scales).
    pub weights: WeightMode,
    /// The planner's limits: FFN split threshold, LM-head chunk rows, device caps.
    pub limits: PlanOptions,
    /// Compile-cache markers (`None`: `--no-ane-cache`).
    pub cache: Option<CompileCache>,
}

impl Default for AneOptions {
    fn default() -> Self {
        AneOptions {
            weights: WeightMode::Fp16,
            limits: PlanOptions::default(),
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
        }
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
}

impl<D: AneDevice + 'static> AneBackend<D> {
    /// A backend that compiles onto `device`.
    pub fn new(device: Arc<D>, opts: AneOptions) -> Self {
        AneBackend {
            device,
            opts,
            counters: Arc::new(Counters::default()),
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

    /// Lower, compile (through the cache) and load one ANE kernel.
    fn program(&self, kernel: AneKernel, weights: &[&[f32]]) -> Result<Program> {
        let start = Instant::now();
        let low = lower(&kernel, weights, self.opts.weights).map_err(|e| self.err(format!("{kernel}: {e}")))?;
        let text = low.mil_text();
        let dev = &*self.device;
        let id = match &self.opts.cache {
            Some(_) => content_id(&dev.cache_salt(), &text, low.weights.iter()),
            None => String::new(),
        };
        // A program whose load fails is released by compile_and_load.
        let (handle, outcome) = compile_or_load(
            self.opts.cache.as_ref(),
            &id,
            || dev.load_without_compile(&text, &low.weights),
            || compile_and_load(dev, &text, &low.weights),
        )
        .map_err(|e| self.err(format!("{kernel}: {e}")))?;
        let c = &self.counters;
        c.programs.fetch_add(1, Ordering::Relaxed);
        if outcome == CacheOutcome::Loaded {
            c.cache_loads.fetch_add(1, Ordering::Relaxed);
        } else {
            c.compiled.fetch_add(1, Ordering::Relaxed);
        }
        c.compile_ns.fetch_add(ns(start.elapsed()), Ordering::Relaxed);
        Ok(Program {
            handle,
            weight_bytes: kernel.weight_bytes(self.opts.weights) as u64,
            outputs: kernel.output_channels(),
            kernel,
        })
    }

    fn kernel(&self, shape: KernelShape, layout: Layout) -> Box<dyn Kernel> {
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
        match spec {
            KernelSpec::Linear { w } => {
                let m = dense(weights, w)?;
                let per = linear_chunk_rows(m.cols, &self.opts.limits).map_err(|e| self.err(e.to_string()))?;
                let mut programs = Vec::with_capacity(m.rows.div_ceil(per));
                // Releases the chunks already loaded if a later one fails.
                let mut guard = Releasing::new(&*self.device);
                for start in (0..m.rows).step_by(per) {
                    let rows = per.min(m.rows - start);
                    let kernel = if rows == m.rows {
                        AneKernel::Linear { rows, cols: m.cols }
                    } else {
                        AneKernel::LmHeadChunk { rows, cols: m.cols }
                    };
                    let part = &m.data[start * m.cols..(start + rows) * m.cols];
                    let p = self.program(kernel, &[part])?;
                    guard.add(p.handle);
                    programs.push(p);
                }
                guard.keep();
                let shape = KernelShape {
                    input: m.cols,
                    output: m.rows,
                };
                Ok(self.kernel(shape, Layout::Rows(programs)))
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
                let p = self.program(AneKernel::FusedLinear { parts, cols }, &data)?;
                Ok(self.kernel(KernelShape { input: cols, output }, Layout::Rows(vec![p])))
            }
            KernelSpec::LinearResidual { w } => {
                let m = dense(weights, w)?;
                let (rows, cols) = (m.rows, m.cols);
                let p = self.program(AneKernel::LinearResidual { rows, cols }, &[&m.data])?;
                Ok(self.kernel(
                    KernelShape {
                        input: cols,
                        output: rows,
                    },
                    Layout::Residual(p),
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
                let planned = plan_ffn(hidden, inter, &self.opts.limits).map_err(|e| self.err(e.to_string()))?;
                if let [one] = planned.as_slice() {
                    let p = self.program(one.kernel.clone(), &[&g.data, &u.data, &d.data])?;
                    return Ok(self.kernel(shape, Layout::Residual(p)));
                }
                let mut programs = Vec::with_capacity(planned.len());
                let mut guard = Releasing::new(&*self.device);
                for (index, k) in planned.into_iter().enumerate() {
                    let AneKernel::FfnChunk { chunk, .. } = k.kernel else {
                        return Err(self.err(format!("the FFN plan gave {}, expected chunks", k.kernel)));
                    };
                    let c = ffn_chunk_weights(&g.data, &u.data, &d.data, hidden, inter, index, chunk)
                        .map_err(|e| self.err(e.to_string()))?;
                    let p = self.program(k.kernel, &[&c.gate, &c.up, &c.down])?;
                    guard.add(p.handle);
                    programs.push(p);
                }
                guard.keep();
                Ok(self.kernel(shape, Layout::Chunks(programs)))
            }
            KernelSpec::SwiGluAccumulate { gate, up, down } => {
                let (g, u, d) = (dense(weights, gate)?, dense(weights, up)?, dense(weights, down)?);
                let (chunk, hidden) = (g.rows, g.cols);
                expect(&u, chunk, hidden)?;
                expect(&d, hidden, chunk)?;
                let p = self.program(AneKernel::FfnChunk { hidden, chunk }, &[&g.data, &u.data, &d.data])?;
                Ok(self.kernel(
                    KernelShape {
                        input: hidden,
                        output: hidden,
                    },
                    Layout::Chunks(vec![p]),
                ))
            }
        }
    }
}

/// One loaded program of a kernel.
struct Program {
    handle: ProgramHandle,
    kernel: AneKernel,
    outputs: usize,
    weight_bytes: u64,
}

/// How a kernel's programs combine.
enum Layout {
    /// `x` → every program; outputs concatenated in order (row chunks, or one fused linear).
    Rows(Vec<Program>),
    /// `(x, r)` → one program with inputs x and r.
    Residual(Program),
    /// `(x, r)` → accumulating FFN chunks over the packed input `x ‖ acc`, acc starting at r.
    Chunks(Vec<Program>),
}

impl Layout {
    fn programs(&self) -> &[Program] {
        match self {
            Layout::Rows(p) | Layout::Chunks(p) => p,
            Layout::Residual(p) => std::slice::from_ref(p),
        }
    }
}

struct AneRun<D: AneDevice> {
    device: Arc<D>,
    counters: Arc<Counters>,
    shape: KernelShape,
    layout: Layout,
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

/// Lanes `start..start + n` of `b` into a fresh surface (round to nearest even).
fn pack(b: &Batch, start: usize, n: usize) -> Result<Surface> {
    let mut s = Surface::new(b.channels());
    for j in 0..n {
        s.write_lane(j, b.lane(start + j)).map_err(surface_err)?;
    }
    Ok(s)
}

/// Channels of `s` into lanes `start..start + n` of `out` at channel `offset`.
fn unpack(s: &Surface, out: &mut Batch, start: usize, n: usize, offset: usize) {
    let w = s.lanes();
    let halves = s.halves();
    for j in 0..n {
        let dst = &mut out.lane_mut(start + j)[offset..offset + s.channels()];
        for (c, y) in dst.iter_mut().enumerate() {
            *y = halves[c * w + j].to_f32();
        }
    }
}

fn surface_err(e: anelm_ane::SurfaceError) -> EngineError {
    EngineError::Backend {
        backend: "ane".into(),
        message: e.to_string(),
    }
}

struct Tally {
    dispatch: Dispatch,
    dispatches: u64,
    bytes: u64,
}

impl<D: AneDevice> AneRun<D> {
    fn err(&self, message: impl Into<String>) -> EngineError {
        EngineError::Backend {
            backend: self.device.name().to_string(),
            message: message.into(),
        }
    }

    fn eval(&self, p: &Program, inputs: &[&Surface], tally: &mut Tally) -> Result<Surface> {
        let mut out = [Surface::new(p.outputs)];
        let t = self
            .device
            .evaluate(p.handle, inputs, &mut out)
            .map_err(|e| self.err(format!("{}: {e}", p.kernel)))?;
        tally.dispatches += 1;
        tally.bytes += t.bytes;
        tally.dispatch.weight_bytes += p.weight_bytes;
        tally.dispatch.activation_bytes += t.bytes.saturating_sub(p.weight_bytes);
        let m = tally.dispatch.modelled.get_or_insert(Duration::ZERO);
        *m += t.ane;
        let [out] = out;
        Ok(out)
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
        if matches!(self.layout, Layout::Rows(_)) {
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
        let mut tally = Tally {
            dispatch: Dispatch {
                lanes,
                ..Dispatch::default()
            },
            dispatches: 0,
            bytes: 0,
        };
        for start in (0..lanes).step_by(LANES) {
            let n = LANES.min(lanes - start);
            let xs = pack(x, start, n)?;
            match (&self.layout, r) {
                (Layout::Rows(programs), _) => {
                    let mut offset = 0;
                    for p in programs {
                        let y = self.eval(p, &[&xs], &mut tally)?;
                        unpack(&y, out, start, n, offset);
                        offset += p.outputs;
                    }
                }
                (Layout::Residual(p), Some(r)) => {
                    let rs = pack(r, start, n)?;
                    let y = self.eval(p, &[&xs, &rs], &mut tally)?;
                    unpack(&y, out, start, n, 0);
                }
                (Layout::Chunks(programs), Some(r)) => {
                    let h = self.shape.input;
                    let mut packed = Surface::new(2 * h);
                    packed.copy_channels_from(0, &xs).map_err(surface_err)?;
                    let mut acc = pack(r, start, n)?;
                    for p in programs {
                        packed.copy_channels_from(h, &acc).map_err(surface_err)?;
                        acc = self.eval(p, &[&packed], &mut tally)?;
                    }
                    unpack(&acc, out, start, n, 0);
                }
                (_, None) => return Err(self.err("residual kernel run without r")),
            }
        }
        let elapsed = start_time.elapsed();
        tally.dispatch.elapsed = elapsed;
        let c = &self.counters;
        c.dispatches.fetch_add(tally.dispatches, Ordering::Relaxed);
        c.bytes.fetch_add(tally.bytes, Ordering::Relaxed);
        c.host_ns.fetch_add(ns(elapsed), Ordering::Relaxed);
        c.ane_ns
            .fetch_add(ns(tally.dispatch.modelled.unwrap_or_default()), Ordering::Relaxed);
        Ok(tally.dispatch)
    }
}
