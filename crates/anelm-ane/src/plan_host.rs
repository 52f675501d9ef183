//! The host side of a step: the CPU work between ANE dispatches, counted from its FLOPs and bytes
//! on a chip's [`HostProfile`](crate::chip::HostProfile), for decode with several streams and for
//! W-lane prefill.
//!
//! A dispatch is synchronous in both runtimes modelled here (`ane-runtime.md` §2.3: `evaluate`
//! returns when the outputs are in the surfaces), and each layer's host work needs the previous
//! dispatch's output and feeds the next, so a step's time is the sum of
//!
//! - the ANE dispatches, `fixed + bytes / bandwidth` each, int8 weights at the chip's int8
//!   efficiency ([`ChipProfile::weights_dispatch_seconds`]);
//! - a fixed host cost per dispatch ([`HostProfile::dispatch_us`](crate::chip::HostProfile));
//! - surface packing and unpacking, which depends on the runtime ([`HostRuntime`]), as does which
//!   kernels a runtime batches across streams and prompt tokens;
//! - per stream, the f32 work between dispatches: norms, RoPE, attention over the context, the
//!   DeltaNet recurrence and conv, GeGLU and residual adds where the block needs them, and
//!   sampling over the vocabulary, each `flops / GFLOP/s + bytes / GB/s` on one core.
//!
//! The C++ system (§7.2: the decode loop runs each session's CPU work, then the next dispatch)
//! does all of it on one core. anelm (issue 38) takes host work off the critical path where the
//! data allow: attention and the DeltaNet recurrence run as one parallel section per layer on
//! the kernel pool (tasks per lane × head and per value head, [`HostProfile::cores`] at
//! [`HostProfile::parallel_efficiency`], plus a hand-off per section); the LM head's row chunks
//! are evaluated by a helper thread while the caller unpacks the previous chunk, so only the
//! last chunk's unpacking is on the path; surfaces are reused (no zeroing or serialising of the
//! 32 lanes, one memcpy each way) and requests built once, so a dispatch costs the host
//! [`HostProfile::reused_dispatch_us`]. [`HostOptions::serial`] models the same runtime on one
//! core without the overlap. The C++ system's pipelined serve branch overlaps a prefill thread
//! with decode (§7.2) and parallelises per-session CPU work (`2a1ce5e`); neither is modelled
//! for `--runtime ane-cpp` (its measured figures come from the serial loop).
//!
//! [`HostProfile::cores`]: crate::chip::HostProfile::cores
//! [`HostProfile::parallel_efficiency`]: crate::chip::HostProfile::parallel_efficiency
//! [`HostProfile::reused_dispatch_us`]: crate::chip::HostProfile::reused_dispatch_us

use std::fmt::{self, Write as _};

use crate::chip::ChipProfile;
use crate::kernel::{AneKernel, WeightMode};
use crate::plan::{BlockLayout, KernelRole, LayerKind, ModelDims, Plan};
use crate::surface::LANES;

/// Default context (tokens already in the cache) the attention term is counted at: the measured
/// runs generated 500 tokens after a short prompt (`ane-runtime.md` §11), so their mean context is
/// about 250 plus the prompt.
pub const DEFAULT_CONTEXT: usize = 256;

/// Causal conv width of the Gated DeltaNet (`linear_conv_kernel_dim`, 4 in every Qwen3.5,
/// `ane-runtime.md` §6.3).
const DELTANET_CONV: usize = 4;

/// Rows per LM-head chunk in the C++ system: 65,536 for Qwen3.5, 32,768 for Qwen3
/// (`ane-runtime.md` §3.4). Its chunking ignores any size limit.
const CPP_LM_HEAD_ROWS_HYBRID: usize = 65_536;
const CPP_LM_HEAD_ROWS_DENSE: usize = 32_768;

/// Starting and joining the thread that evaluates a row-chunked kernel's chunks
/// (`kernel_run.rs`, once per LM-head run), µs: a `pthread_create` + join on macOS (assumed).
const PIPELINE_THREAD_US: f64 = 30.0;

/// Bytes of one fp16 surface row: 32 lanes × 2 bytes per channel.
const ROW_BYTES: f64 = (LANES * 2) as f64;

/// The code around the dispatches, which decides what the host does per surface and per prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostRuntime {
    /// anelm (`ane_backend.rs`, `kernel_run.rs`, `apple/device.rs`): every dispatch packs the used
    /// lanes into a reused surface (stale lanes zeroed only when fewer lanes follow more) and
    /// copies its bytes into the IOSurface in one memcpy; outputs come back in one memcpy and
    /// the used lanes are unpacked. Attention and DeltaNet run in parallel on the kernel pool;
    /// the LM head's chunks are pipelined. Prefill runs 32 prompt tokens per dispatch (W lanes)
    /// through every kernel.
    Anelm,
    /// The C++ system (`ane-runtime.md` §5, §7): one stream writes lane 0 only (hardware
    /// conversion, no memset) and reads lane 0; two or more build a dense fp32 staging array, memset
    /// the surface, convert all 32 lanes in software (truncating) and read all 32 back. Prefill
    /// runs 4 tokens per chunk (`ANE_PREFILL_BATCH`), with the Qwen3.5 input projection dispatched
    /// per token; a chunked FFN runs per stream and per prompt token (it is not W-lane batched);
    /// the DeltaNet gates `in_proj_a/b` are CPU mat-vecs.
    AneCpp,
}

impl HostRuntime {
    /// Every runtime.
    pub const ALL: [HostRuntime; 2] = [HostRuntime::Anelm, HostRuntime::AneCpp];

    /// `--runtime` name.
    pub fn name(self) -> &'static str {
        match self {
            HostRuntime::Anelm => "anelm",
            HostRuntime::AneCpp => "ane-cpp",
        }
    }

    /// The runtime called `name`.
    pub fn by_name(name: &str) -> Option<HostRuntime> {
        let n = name.trim().to_ascii_lowercase().replace('_', "-");
        HostRuntime::ALL.into_iter().find(|r| r.name() == n)
    }

    /// Prompt tokens per prefill dispatch.
    pub fn prefill_lanes(self) -> usize {
        match self {
            HostRuntime::Anelm => LANES,
            HostRuntime::AneCpp => 4,
        }
    }

    /// Whether prefill runs a kernel once for all of a chunk's tokens (else once per token).
    fn prefill_batches(self, role: KernelRole, dims: &ModelDims) -> bool {
        match self {
            HostRuntime::Anelm => true,
            // ane-runtime.md §7.1: Qwen3.5 dispatches first_proj per token, oproj/ffn batched; a
            // chunked FFN runs per token.
            HostRuntime::AneCpp => {
                !(role == KernelRole::InputProj && dims.linear_attention.is_some()) && self.decode_batches(role)
            }
        }
    }

    /// Whether a multi-stream decode step runs a kernel once for all streams (else once per stream).
    fn decode_batches(self, role: KernelRole) -> bool {
        match self {
            HostRuntime::Anelm => true,
            // ane-runtime.md §3.5 and §7.2: the chunked FFN is not W-lane batched; forward_batch runs
            // it per session.
            HostRuntime::AneCpp => !matches!(role, KernelRole::FfnChunk { .. }),
        }
    }

    /// The LM-head kernels this runtime dispatches for `plan`, or `None` when it runs the LM head
    /// on the host. anelm dispatches the planner's chunks, which fit the device's per-kernel limit.
    /// The C++ system cuts fixed row chunks whatever their size and, when the device refuses
    /// any chunk, frees them all and runs the LM head as an fp32 `cblas_sgemv` per stream
    /// (`ane-runtime.md` §2.6, §3.9). The limit is on the constants handed to the compiler (stored
    /// bytes): the 9B int8 chunks (268 MB stored, 537 MB expanded) run at the ANE's rate.
    fn lm_head(self, plan: &Plan) -> Option<Vec<AneKernel>> {
        match self {
            HostRuntime::Anelm => Some(plan.lm_head.iter().map(|k| k.kernel.clone()).collect()),
            HostRuntime::AneCpp => {
                let d = &plan.dims;
                let rows = if d.linear_attention.is_some() {
                    CPP_LM_HEAD_ROWS_HYBRID
                } else {
                    CPP_LM_HEAD_ROWS_DENSE
                };
                let chunks: Vec<AneKernel> = (0..d.vocab.div_ceil(rows))
                    .map(|i| AneKernel::LmHeadChunk {
                        rows: rows.min(d.vocab - i * rows),
                        cols: d.hidden,
                    })
                    .collect();
                let limit = plan.options.limits.max_kernel_const_bytes;
                let refused = chunks
                    .iter()
                    .any(|k| k.weight_bytes(plan.options.weights) as u64 > limit);
                (!refused).then_some(chunks)
            }
        }
    }

    /// Whether the DeltaNet gate projections run on the host (else fused into the input projection).
    fn deltanet_gates_on_host(self) -> bool {
        self == HostRuntime::AneCpp
    }

    /// Host work of packing `inputs` (channel counts) and of unpacking `output` channels for one
    /// dispatch carrying `lanes` lanes: (packing, unpacking).
    fn surfaces(self, inputs: &[usize], output: usize, lanes: usize) -> (Work, Work) {
        let c_in: usize = inputs.iter().sum();
        let (ci, co, s) = (c_in as f64, output as f64, lanes as f64);
        let w = LANES as f64;
        match self {
            HostRuntime::Anelm => (
                Work {
                    // the used lanes written into the reused surface's rows, one memcpy into the
                    // IOSurface (read + write).
                    bytes: ci * ROW_BYTES * 3.0,
                    elements: ci * s,
                    ..Work::default()
                },
                Work {
                    // one memcpy out of the IOSurface (read + write); the used lanes unpacked.
                    bytes: co * ROW_BYTES * 2.0,
                    elements: co * s,
                    ..Work::default()
                },
            ),
            HostRuntime::AneCpp if lanes <= 1 => (
                Work {
                    // one fp16 per 64-byte row: each row is read for ownership and written back.
                    bytes: ci * ROW_BYTES * 2.0,
                    elements: ci,
                    ..Work::default()
                },
                Work {
                    bytes: co * ROW_BYTES,
                    elements: co,
                    ..Work::default()
                },
            ),
            HostRuntime::AneCpp => (
                Work {
                    // fp32 staging (write), surface memset, software conversion (read fp32, write
                    // fp16).
                    bytes: ci * (2.0 * ROW_BYTES + ROW_BYTES + 3.0 * ROW_BYTES),
                    elements: ci * s,
                    soft_elements: ci * w,
                    ..Work::default()
                },
                Work {
                    // dense read of all lanes into fp32.
                    bytes: co * 3.0 * ROW_BYTES,
                    elements: co * (w + s),
                    ..Work::default()
                },
            ),
        }
    }

    /// Host time per dispatch beyond the ANE's fixed cost on `chip`, seconds.
    fn dispatch_seconds(self, chip: &ChipProfile) -> f64 {
        match self {
            HostRuntime::Anelm => chip.host.reused_dispatch_us * 1e-6,
            HostRuntime::AneCpp => chip.host.dispatch_us * 1e-6,
        }
    }
}

impl fmt::Display for HostRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Settings of the host model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostOptions {
    /// The code around the dispatches.
    pub runtime: HostRuntime,
    /// Tokens already in each stream's context (what attention reads per token).
    pub context: usize,
    /// All host work on one core, nothing overlapped with the ANE (anelm's runtime without its
    /// pool and pipelining; the C++ runtime always runs this way).
    pub serial: bool,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            runtime: HostRuntime::Anelm,
            context: DEFAULT_CONTEXT,
            serial: false,
        }
    }
}

impl HostOptions {
    /// Whether host work runs in parallel sections and overlaps the LM head's dispatches.
    pub fn overlapped(&self) -> bool {
        self.runtime == HostRuntime::Anelm && !self.serial
    }

    /// The speed-up of a parallel section of `tasks` independent tasks on `chip`'s host.
    fn speedup(&self, chip: &ChipProfile, tasks: usize) -> f64 {
        if !self.overlapped() {
            return 1.0;
        }
        let h = &chip.host;
        (tasks.min(h.cores.max(1)) as f64 * h.parallel_efficiency).max(1.0)
    }
}

/// FLOPs, bytes and per-element loop iterations of some host work.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Work {
    /// f32 floating-point operations.
    pub flops: f64,
    /// Bytes read and written.
    pub bytes: f64,
    /// Elements through a scalar loop (conversion, gather, scatter).
    pub elements: f64,
    /// Elements through a software fp32 → fp16 conversion.
    pub soft_elements: f64,
}

impl Work {
    fn new(flops: f64, bytes: f64) -> Work {
        Work {
            flops,
            bytes,
            ..Work::default()
        }
    }

    pub(crate) fn add(&mut self, o: Work) {
        self.flops += o.flops;
        self.bytes += o.bytes;
        self.elements += o.elements;
        self.soft_elements += o.soft_elements;
    }

    pub(crate) fn scaled(self, k: f64) -> Work {
        Work {
            flops: self.flops * k,
            bytes: self.bytes * k,
            elements: self.elements * k,
            soft_elements: self.soft_elements * k,
        }
    }

    /// Seconds of a parallel section at `speedup` over one core, its bytes no faster than the
    /// host's [`memory_gb_s`](crate::chip::HostProfile::memory_gb_s) all cores share.
    pub fn parallel_seconds(&self, chip: &ChipProfile, speedup: f64) -> f64 {
        let h = &chip.host;
        let sp = speedup.max(1.0);
        let bytes = (self.bytes / (h.gb_s * 1e9 * sp)).max(self.bytes / (h.memory_gb_s.max(h.gb_s) * 1e9));
        (self.flops / (h.gflops * 1e9)
            + self.elements * h.element_ns * 1e-9
            + self.soft_elements * h.soft_convert_ns * 1e-9)
            / sp
            + bytes
    }

    /// Seconds on one core of `chip`.
    pub fn seconds(&self, chip: &ChipProfile) -> f64 {
        self.parallel_seconds(chip, 1.0)
    }
}

/// One stream's host work per token, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StreamWork {
    /// Norms, RoPE, QK-norm, output gates, residual adds, GeGLU, the embedding row.
    pub elementwise: Work,
    /// Attention scores, softmax and the weighted sum over the context, and the KV append.
    pub attention: Work,
    /// The DeltaNet conv, gates, normalisation, recurrence and gated norm.
    pub deltanet: Work,
    /// Sampling over the vocabulary.
    pub sampling: Work,
}

/// Taps of a short-convolution layer (LFM2's `conv_L_cache`; its host work is small enough that
/// the published models' 3 stands for all).
const SHORT_CONV_TAPS: usize = 3;

/// One stream's host work for one token of `dims`, whose layers' mixers are `kinds`, at
/// `context` tokens of context.
pub fn stream_work(dims: &ModelDims, kinds: &[LayerKind], opts: &HostOptions, sample: bool) -> StreamWork {
    let f = |x: usize| x as f64;
    let (h, hd) = (f(dims.hidden), f(dims.head_dim));
    let (nh, nkv) = (f(dims.heads), f(dims.kv_heads));
    let mut w = StreamWork::default();
    // An RMSNorm of n: square-accumulate, scale, weight (4 flops); read x and w, write y.
    let norm = |n: f64| Work::new(4.0 * n, 12.0 * n);
    w.elementwise.add(Work::new(0.0, 8.0 * h)); // embedding row
    for &kind in kinds {
        match dims.block {
            BlockLayout::PreNorm => {
                w.elementwise.add(norm(h).scaled(2.0));
            }
            BlockLayout::Sandwich => {
                let inter = f(dims.intermediate);
                w.elementwise.add(norm(h).scaled(4.0));
                w.elementwise.add(Work::new(2.0 * h, 24.0 * h)); // two residual adds
                // tanh GELU (~20 flops) times up; read gate and up, write the product.
                w.elementwise.add(Work::new(22.0 * inter, 12.0 * inter));
            }
        }
        match (kind, dims.linear_attention) {
            (LayerKind::LinearAttention, Some(la)) => {
                let (hk, hv) = (f(la.key_heads), f(la.value_heads));
                let (dk, dv) = (f(la.key_head_dim), f(la.value_head_dim));
                let (k, v) = (hk * dk, hv * dv);
                let conv_dim = 2.0 * k + v;
                let taps = f(DELTANET_CONV);
                let d = &mut w.deltanet;
                if opts.runtime.deltanet_gates_on_host() {
                    // a = W_a·h, b = W_b·h with fp32 weights [Hv, hidden].
                    d.add(Work::new(4.0 * hv * h, 8.0 * hv * h));
                }
                // causal conv over `taps` positions + SiLU; ring state read and written.
                d.add(Work::new(
                    conv_dim * (2.0 * taps + 5.0),
                    conv_dim * 4.0 * (2.0 * (taps - 1.0) + 2.0),
                ));
                d.add(Work::new(2.0 * k * 4.0, 0.0)); // l2-norm of q and k
                d.add(Work::new(hv * 30.0, 0.0)); // β, g
                // S ← g·S; u = Sᵀk; S += βk(v − u)ᵀ; y = Sᵀq: ~7 flops per state element, the state
                // read and written once (fp32).
                d.add(Work::new(7.0 * hv * dk * dv, 8.0 * hv * dk * dv));
                d.add(Work::new(10.0 * v, 12.0 * v)); // gated RMSNorm · SiLU(z)
            }
            (LayerKind::ShortConv, _) => {
                // B ⊙ x, a depthwise causal conv of SHORT_CONV_TAPS taps (its ring state read and
                // written), C ⊙ y: a few flops per hidden channel.
                let taps = f(SHORT_CONV_TAPS);
                w.elementwise
                    .add(Work::new(h * (2.0 * taps + 2.0), h * 4.0 * (2.0 * taps + 4.0)));
            }
            _ => {
                let ctx = match kind {
                    LayerKind::SlidingAttention => {
                        opts.context.min(dims.sliding_window.map_or(usize::MAX, |s| s.window))
                    }
                    _ => opts.context,
                };
                let l = f(ctx.max(1));
                let qk = (nh + nkv) * hd;
                w.elementwise.add(norm(qk)); // QK-norm
                w.elementwise.add(Work::new(3.0 * qk, 8.0 * qk)); // RoPE
                if dims.attn_output_gate {
                    w.elementwise.add(Work::new(5.0 * nh * hd, 12.0 * nh * hd));
                }
                let a = &mut w.attention;
                a.add(Work::new(0.0, 2.0 * nkv * hd * 4.0)); // KV append
                // q·k and p·v per head over the context, softmax; K and V read once per KV head.
                a.add(Work::new(
                    nh * l * (4.0 * hd + 5.0),
                    2.0 * nkv * l * hd * 4.0 + nh * l * 8.0,
                ));
            }
        }
    }
    w.elementwise.add(norm(h)); // final norm
    if sample {
        // Penalties, a top-k select over every logit, softmax and top-p over the candidates:
        // ~4 flops and three f32 passes per vocabulary entry.
        let v = f(dims.vocab);
        w.sampling = Work::new(4.0 * v, 12.0 * v);
    }
    w
}

/// What one step costs, by term, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepCost {
    /// Tokens the step produces (streams for decode, prompt tokens for prefill).
    pub tokens: usize,
    /// ANE dispatches in the step.
    pub dispatches: usize,
    /// ANE fixed cost of every dispatch.
    pub ane_fixed: f64,
    /// ANE streaming of weights and surfaces.
    pub ane_stream: f64,
    /// Host cost per dispatch (call and wake-up).
    pub host_dispatch: f64,
    /// Surface packing and unpacking.
    pub surfaces: f64,
    /// Norms, RoPE, residual adds, GeGLU (all streams).
    pub elementwise: f64,
    /// Attention over the context (all streams).
    pub attention: f64,
    /// DeltaNet recurrence and conv (all streams).
    pub deltanet: f64,
    /// Sampling (all streams).
    pub sampling: f64,
    /// The LM head on the host, where the runtime fell back to the CPU (all streams).
    pub lm_head_host: f64,
    /// Handing parallel sections to the kernel pool and joining them.
    pub pool: f64,
    /// Host work done while the ANE runs (off the critical path, not in the step): the LM
    /// head's chunks unpacked while the next chunk is evaluated.
    pub hidden: f64,
    /// Host work summed over every core (what the CPU spends, on the path or not).
    pub core_seconds: f64,
    /// Cores the host's parallel sections use (1 when serial).
    pub cores: usize,
}

impl StepCost {
    /// The step, seconds.
    pub fn seconds(&self) -> f64 {
        self.ane() + self.host()
    }

    /// The ANE's part, seconds.
    pub fn ane(&self) -> f64 {
        self.ane_fixed + self.ane_stream
    }

    /// The host's part, seconds.
    pub fn host(&self) -> f64 {
        self.host_dispatch
            + self.surfaces
            + self.elementwise
            + self.attention
            + self.deltanet
            + self.sampling
            + self.lm_head_host
            + self.pool
    }

    /// The share of the step the ANE is busy.
    pub fn ane_utilisation(&self) -> f64 {
        self.ane() / self.seconds().max(1e-12)
    }

    /// The share of the step the host's work is on the critical path.
    pub fn host_share(&self) -> f64 {
        self.host() / self.seconds().max(1e-12)
    }

    /// The share of the host's cores' time in the step spent on host work.
    pub fn cpu_utilisation(&self) -> f64 {
        self.core_seconds / (self.cores.max(1) as f64 * self.seconds().max(1e-12))
    }

    /// Tokens per second.
    pub fn tok_s(&self) -> f64 {
        self.tokens as f64 / self.seconds().max(1e-12)
    }

    /// `(name, seconds)` of every term, in a fixed order.
    pub fn terms(&self) -> [(&'static str, f64); 10] {
        [
            ("ane fixed", self.ane_fixed),
            ("ane streaming", self.ane_stream),
            ("host per dispatch", self.host_dispatch),
            ("host surfaces", self.surfaces),
            ("host norms/rope/elementwise", self.elementwise),
            ("host attention", self.attention),
            ("host deltanet", self.deltanet),
            ("host sampling", self.sampling),
            ("host lm head (cpu fallback)", self.lm_head_host),
            ("host pool hand-offs", self.pool),
        ]
    }

    fn add(&mut self, o: &StepCost) {
        self.dispatches += o.dispatches;
        self.ane_fixed += o.ane_fixed;
        self.ane_stream += o.ane_stream;
        self.host_dispatch += o.host_dispatch;
        self.surfaces += o.surfaces;
        self.elementwise += o.elementwise;
        self.attention += o.attention;
        self.deltanet += o.deltanet;
        self.sampling += o.sampling;
        self.lm_head_host += o.lm_head_host;
        self.pool += o.pool;
        self.hidden += o.hidden;
        self.core_seconds += o.core_seconds;
    }

    /// A table of the terms per token: ms and share of the step.
    pub fn explain(&self) -> String {
        let total = self.seconds().max(1e-12);
        let per = 1e3 / self.tokens.max(1) as f64;
        let mut s = String::new();
        for (name, t) in self.terms() {
            let _ = writeln!(
                s,
                "    {name:<28} {:>8.2} ms/token {:>5.1} %",
                t * per,
                t / total * 100.0
            );
        }
        let _ = writeln!(
            s,
            "    {:<28} {:>8.2} ms/token (ANE {:.1} %, host {:.1} %; {} dispatches per step)",
            "total",
            total * per,
            self.ane() / total * 100.0,
            self.host() / total * 100.0,
            self.dispatches
        );
        let _ = writeln!(
            s,
            "    utilisation: ANE busy {:.1} % of the step; host critical path {:.1} %; {} core{} busy {:.1} % \
             ({:.2} ms/token of host work overlapped with the ANE)",
            self.ane_utilisation() * 100.0,
            self.host_share() * 100.0,
            self.cores.max(1),
            if self.cores.max(1) == 1 { "" } else { "s" },
            self.cpu_utilisation() * 100.0,
            self.hidden * per
        );
        s
    }
}

/// One dispatch of `k` carrying `lanes` lanes, ANE and host, added to `cost` (its surfaces
/// serially on the calling thread). Returns (ANE seconds, output-unpacking seconds) for callers
/// that overlap the unpacking with the next dispatch.
pub(crate) fn dispatch(
    cost: &mut StepCost,
    k: &AneKernel,
    mode: WeightMode,
    lanes: usize,
    chip: &ChipProfile,
    rt: HostRuntime,
) -> (f64, f64) {
    let weights = k.weight_bytes(mode) as u64;
    let io = k.io_bytes() as u64;
    let ane = chip.weights_dispatch_seconds(weights, io, mode);
    let host = rt.dispatch_seconds(chip);
    cost.dispatches += 1;
    cost.ane_fixed += chip.fixed_us * 1e-6;
    cost.ane_stream += ane - chip.fixed_us * 1e-6;
    cost.host_dispatch += host;
    let (pack, unpack) = rt.surfaces(&k.input_channels(), k.output_channels(), lanes);
    let (pack, unpack) = (pack.seconds(chip), unpack.seconds(chip));
    cost.surfaces += pack + unpack;
    cost.core_seconds += host + pack + unpack;
    (ane, unpack)
}

/// One stream's LM head as an fp32 mat-vec on the host (the C++ fallback, `cblas_sgemv` over the
/// fp32 `lm_head`): 2 flops and 4 bytes of weights per element.
fn host_lm_head(dims: &ModelDims) -> Work {
    let n = dims.vocab as f64 * dims.hidden as f64;
    Work::new(2.0 * n, 4.0 * n)
}

/// `n` lanes' (streams' or prompt tokens') host work added to `cost`: attention and DeltaNet as
/// one parallel section per layer where the runtime has one (tasks per lane × head and per value
/// head), norms and sampling serially.
fn add_streams(
    cost: &mut StepCost,
    w: &StreamWork,
    n: usize,
    dims: &ModelDims,
    chip: &ChipProfile,
    host: &HostOptions,
) {
    let k = n as f64;
    let (elementwise, attention) = (w.elementwise.seconds(chip) * k, w.attention.seconds(chip) * k);
    let (deltanet, sampling) = (w.deltanet.seconds(chip) * k, w.sampling.seconds(chip) * k);
    let value_heads = dims.linear_attention.map_or(1, |la| la.value_heads);
    cost.elementwise += elementwise;
    cost.attention += w
        .attention
        .scaled(k)
        .parallel_seconds(chip, host.speedup(chip, n * dims.heads));
    cost.deltanet += w
        .deltanet
        .scaled(k)
        .parallel_seconds(chip, host.speedup(chip, value_heads));
    cost.sampling += sampling;
    cost.core_seconds += elementwise + attention + deltanet + sampling;
    if host.overlapped() {
        cost.pool += dims.layers as f64 * chip.host.section_us * 1e-6;
        cost.core_seconds += dims.layers as f64 * chip.host.section_us * 1e-6;
        cost.cores = chip.host.cores.max(1);
    } else {
        cost.cores = 1;
    }
}

impl Plan {
    /// One decode step of `streams` concurrent streams (groups of up to 32 lanes each run every
    /// kernel once), ANE and host.
    pub fn decode_cost(&self, chip: &ChipProfile, host: &HostOptions, streams: usize) -> StepCost {
        let streams = streams.max(1);
        let mut cost = StepCost {
            tokens: streams,
            ..StepCost::default()
        };
        let mode = self.options.weights;
        let lm_head = host.runtime.lm_head(self);
        let mut left = streams;
        while left > 0 {
            let lanes = left.min(LANES);
            let mut group = StepCost::default();
            for k in self.layers.iter().flat_map(|l| &l.kernels) {
                if lanes > 1 && !host.runtime.decode_batches(k.role) {
                    for _ in 0..lanes {
                        dispatch(&mut group, &k.kernel, mode, 1, chip, host.runtime);
                    }
                } else {
                    dispatch(&mut group, &k.kernel, mode, lanes, chip, host.runtime);
                }
            }
            // The LM head's chunks: with the pipelined runtime, chunk i's unpacking runs while
            // chunk i + 1 is evaluated, so it leaves the path where it is the shorter of the two.
            let chunks = lm_head.as_deref().unwrap_or(&[]);
            if chunks.len() > 1 && host.overlapped() {
                group.pool += PIPELINE_THREAD_US * 1e-6;
                group.core_seconds += PIPELINE_THREAD_US * 1e-6;
            }
            let mut prev_unpack: Option<f64> = None;
            for k in chunks {
                let (ane, unpack) = dispatch(&mut group, k, mode, lanes, chip, host.runtime);
                if let Some(u) = prev_unpack.filter(|_| host.overlapped()) {
                    let off = u.min(ane);
                    group.surfaces -= off;
                    group.hidden += off;
                }
                prev_unpack = Some(unpack);
            }
            cost.add(&group);
            left -= lanes;
        }
        add_streams(
            &mut cost,
            &stream_work(&self.dims, &self.layer_kinds(), host, true),
            streams,
            &self.dims,
            chip,
            host,
        );
        if lm_head.is_none() {
            cost.lm_head_host = host_lm_head(&self.dims).seconds(chip) * streams as f64;
            cost.core_seconds += cost.lm_head_host;
        }
        cost
    }

    /// Modelled decode tokens/s with `streams` concurrent streams, host work included.
    pub fn host_decode_tok_s(&self, chip: &ChipProfile, host: &HostOptions, streams: usize) -> f64 {
        self.decode_cost(chip, host, streams).tok_s()
    }

    /// One prefill chunk of the runtime's W-lane batch (prompt tokens per dispatch): every layer
    /// kernel once for the chunk (or once per token where the runtime does not batch it) and
    /// each token's host work. The LM head runs once per prompt and is left out.
    pub fn prefill_cost(&self, chip: &ChipProfile, host: &HostOptions) -> StepCost {
        let lanes = host.runtime.prefill_lanes();
        let mut cost = StepCost {
            tokens: lanes,
            ..StepCost::default()
        };
        let mode = self.options.weights;
        for k in self.layers.iter().flat_map(|l| &l.kernels) {
            if host.runtime.prefill_batches(k.role, &self.dims) {
                dispatch(&mut cost, &k.kernel, mode, lanes, chip, host.runtime);
            } else {
                for _ in 0..lanes {
                    dispatch(&mut cost, &k.kernel, mode, 1, chip, host.runtime);
                }
            }
        }
        add_streams(
            &mut cost,
            &stream_work(&self.dims, &self.layer_kinds(), host, false),
            lanes,
            &self.dims,
            chip,
            host,
        );
        cost
    }

    /// Modelled prefill tokens/s, host work included.
    pub fn host_prefill_tok_s(&self, chip: &ChipProfile, host: &HostOptions) -> f64 {
        self.prefill_cost(chip, host).tok_s()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{LinearAttention, PlanOptions};

    fn qwen35_4b() -> ModelDims {
        ModelDims {
            attn_output_gate: true,
            linear_attention: Some(LinearAttention {
                key_heads: 16,
                value_heads: 32,
                key_head_dim: 128,
                value_head_dim: 128,
            }),
            ..ModelDims::dense(2560, 9216, 16, 4, 256, 248_320, 32)
        }
    }

    /// Qwen3.5's layout: three DeltaNet layers, then one attention layer.
    fn plan(dims: &ModelDims, opts: &PlanOptions) -> Result<Plan, crate::plan::PlanError> {
        let kinds = LayerKind::every_nth(dims.layers, 4, LayerKind::Attention, LayerKind::LinearAttention);
        crate::plan::plan(dims, &kinds, opts)
    }

    #[test]
    fn host_work_grows_with_streams_and_context() {
        let p = plan(&qwen35_4b(), &PlanOptions::default()).unwrap();
        let chip = ChipProfile::m3_max();
        for rt in HostRuntime::ALL {
            let opts = HostOptions {
                runtime: rt,
                context: 256,
                ..HostOptions::default()
            };
            let one = p.decode_cost(&chip, &opts, 1);
            let four = p.decode_cost(&chip, &opts, 4);
            // The ANE part is shared; the host's per-stream part is not.
            assert!((four.ane() - one.ane()).abs() < 1e-9, "{rt}");
            assert!(four.deltanet > 3.9 * one.deltanet, "{rt}");
            assert!(four.tok_s() < 4.0 * one.tok_s(), "{rt}");
            assert!(four.tok_s() > one.tok_s(), "{rt}");
            let long = p.decode_cost(
                &chip,
                &HostOptions {
                    runtime: rt,
                    context: 8192,
                    ..HostOptions::default()
                },
                1,
            );
            assert!(long.attention > 10.0 * one.attention, "{rt}");
            assert_eq!(one.dispatches, 100);
            let sum: f64 = one.terms().iter().map(|(_, t)| t).sum();
            assert!((sum - one.seconds()).abs() < 1e-12);
        }
        // 33 streams need two lane groups: two dispatch sets.
        let c33 = p.decode_cost(&chip, &HostOptions::default(), 33);
        assert_eq!(c33.dispatches, 200);
    }

    #[test]
    fn ane_cpp_dispatches_the_qwen35_input_projection_per_prefill_token() {
        let p = plan(&qwen35_4b(), &PlanOptions::default()).unwrap();
        let chip = ChipProfile::m3_max();
        let cpp = p.prefill_cost(
            &chip,
            &HostOptions {
                runtime: HostRuntime::AneCpp,
                context: 256,
                ..HostOptions::default()
            },
        );
        // 32 layers × (4 input projections + 1 output + 1 FFN).
        assert_eq!((cpp.tokens, cpp.dispatches), (4, 32 * 6));
        let ours = p.prefill_cost(&chip, &HostOptions::default());
        assert_eq!((ours.tokens, ours.dispatches), (32, 32 * 3));
        assert!(ours.tok_s() > cpp.tok_s());
        // A chunked FFN (9B shape) is dispatched per stream by the C++ runtime, once by anelm.
        let nine = ModelDims {
            hidden: 4096,
            intermediate: 12288,
            ..qwen35_4b()
        };
        let p9 = plan(&nine, &PlanOptions::default()).unwrap();
        let cpp = HostOptions {
            runtime: HostRuntime::AneCpp,
            context: 256,
            ..HostOptions::default()
        };
        // fp16: the C++ system's 65,536-row LM-head chunks (536.9 MB) are over the kernel limit,
        // so its LM head runs on the host, once per stream; anelm plans 7 chunks that fit.
        let one = p9.decode_cost(&chip, &cpp, 1);
        let four = p9.decode_cost(&chip, &cpp, 4);
        assert_eq!(one.dispatches, 128);
        assert_eq!(four.dispatches, 128 + 3 * 64);
        assert!(one.lm_head_host > 0.0 && (four.lm_head_host / one.lm_head_host - 4.0).abs() < 1e-9);
        let ours = p9.decode_cost(&chip, &HostOptions::default(), 4);
        assert_eq!((ours.dispatches, ours.lm_head_host), (128 + 7, 0.0));
        // int8: the same chunks store 268 MB and stay on the ANE.
        let p9_int8 = plan(&nine, &PlanOptions::with_weights(WeightMode::INT8_PER_ROW)).unwrap();
        let int8 = p9_int8.decode_cost(&chip, &cpp, 1);
        assert_eq!((int8.dispatches, int8.lm_head_host), (132, 0.0));
        assert_eq!(HostRuntime::by_name("ANE_CPP"), Some(HostRuntime::AneCpp));
        assert_eq!(HostRuntime::by_name("gpu"), None);
    }
}
