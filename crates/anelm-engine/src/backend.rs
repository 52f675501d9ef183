//! The seam between model code and the places kernels run: `KernelSpec` says what one dispatch
//! computes (weights fixed at compile time), a `Backend` compiles it, a `Kernel` runs it.
//! The CPU backend lives in `cpu_backend`; the ANE backends (real and emulated) plug in here.

use std::sync::Arc;
use std::time::Duration;

use anelm_kernels::ComputeUnit;
use anelm_model::tensor_store::TensorStore;

use crate::batch::Batch;
use crate::error::Result;

/// Names one weight tensor in the model's `TensorStore`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WeightId(pub String);

impl WeightId {
    /// A weight id from its tensor name.
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }
}

/// What an accelerator computes in one dispatch. Weights are fixed at compile time.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelSpec {
    /// y = W·x
    Linear {
        /// The weight matrix [out, in].
        w: WeightId,
    },
    /// y = W·x for the LM head (logits). Computed like [`KernelSpec::Linear`]; an accelerator
    /// that cannot build it may run it on the CPU instead (the ANE fallback chain).
    LmHead {
        /// The output (or tied embedding) matrix [vocab, hidden].
        w: WeightId,
    },
    /// y = [W1·x ; W2·x ; …] (fused input projection such as QKV)
    Concat {
        /// The matrices, all with the same input width.
        ws: Vec<WeightId>,
    },
    /// y = r + W·x (output projection plus residual)
    LinearResidual {
        /// The weight matrix [out, in].
        w: WeightId,
    },
    /// y = r + D(silu(G·x) ⊙ U·x) (SwiGLU FFN plus residual)
    SwiGluResidual {
        /// Gate projection [ffn, hidden].
        gate: WeightId,
        /// Up projection [ffn, hidden].
        up: WeightId,
        /// Down projection [hidden, ffn].
        down: WeightId,
    },
    /// y = r + D(silu(G·x) ⊙ U·x) for one chunk of a split FFN (r is the running accumulator).
    SwiGluAccumulate {
        /// Gate rows of this chunk.
        gate: WeightId,
        /// Up rows of this chunk.
        up: WeightId,
        /// Down columns of this chunk.
        down: WeightId,
    },
}

impl KernelSpec {
    /// Whether `run` takes a residual batch `r` as its second input.
    pub fn has_residual(&self) -> bool {
        matches!(
            self,
            Self::LinearResidual { .. } | Self::SwiGluResidual { .. } | Self::SwiGluAccumulate { .. }
        )
    }
}

/// What one dispatch cost. Summed per step, these become `anelm plan` and bench figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Dispatch {
    /// Lanes computed.
    pub lanes: usize,
    /// Weight bytes read.
    pub weight_bytes: u64,
    /// Activation bytes in and out.
    pub activation_bytes: u64,
    /// Host wall time of the dispatch.
    pub elapsed: Duration,
    /// Modelled accelerator time (emulator only).
    pub modelled: Option<Duration>,
    /// Multiply-accumulates of its matrices (rows × columns × lanes).
    pub macs: u64,
    /// The CPU unit its matrices ran on (`None` off the CPU).
    pub unit: Option<ComputeUnit>,
}

/// Multiply-accumulates and kernel time of the dispatches that ran on one CPU unit.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct UnitCost {
    /// Multiply-accumulates.
    pub macs: u64,
    /// Host wall time of those dispatches.
    pub time: Duration,
}

impl UnitCost {
    /// Achieved giga-operations per second (a multiply-add is two), `None` before any time.
    pub fn gops(&self) -> Option<f64> {
        (!self.time.is_zero()).then(|| 2.0 * self.macs as f64 / self.time.as_secs_f64() / 1e9)
    }
}

/// What one forward pass cost: the [`Dispatch`] values of every kernel it ran, summed. Returned
/// by [`crate::LanguageModel::forward_with_cost`], so a caller times its own forward without a
/// counter shared with every other stream.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ForwardCost {
    /// Kernel dispatches.
    pub dispatches: usize,
    /// Weight bytes read.
    pub weight_bytes: u64,
    /// Activation bytes in and out.
    pub activation_bytes: u64,
    /// Host wall time inside the kernels.
    pub kernel_time: Duration,
    /// Modelled accelerator time of the dispatches that have one (the emulator's).
    pub modelled: Option<Duration>,
    /// Multiply-accumulates of the matrices.
    pub macs: u64,
    /// Per CPU unit ([`ComputeUnit::index`]): its dispatches' multiply-accumulates and time.
    pub units: [UnitCost; 3],
}

impl ForwardCost {
    /// The CPU unit that did most of the multiply-accumulates, with its tally.
    pub fn main_unit(&self) -> Option<(ComputeUnit, UnitCost)> {
        ComputeUnit::ALL
            .into_iter()
            .map(|u| (u, self.units[u.index()]))
            .filter(|(_, c)| c.macs > 0)
            .max_by_key(|(_, c)| c.macs)
    }

    /// Count one dispatch.
    pub fn add(&mut self, d: Dispatch) {
        self.dispatches += 1;
        self.weight_bytes += d.weight_bytes;
        self.activation_bytes += d.activation_bytes;
        self.kernel_time += d.elapsed;
        if let Some(m) = d.modelled {
            self.modelled = Some(self.modelled.unwrap_or_default() + m);
        }
        self.macs += d.macs;
        if let Some(u) = d.unit {
            let c = &mut self.units[u.index()];
            c.macs += d.macs;
            c.time += d.elapsed;
        }
    }

    /// Add another forward's cost (several forwards of one measurement).
    pub fn merge(&mut self, o: &ForwardCost) {
        self.dispatches += o.dispatches;
        self.weight_bytes += o.weight_bytes;
        self.activation_bytes += o.activation_bytes;
        self.kernel_time += o.kernel_time;
        if let Some(m) = o.modelled {
            self.modelled = Some(self.modelled.unwrap_or_default() + m);
        }
        self.macs += o.macs;
        for (a, b) in self.units.iter_mut().zip(&o.units) {
            a.macs += b.macs;
            a.time += b.time;
        }
    }
}

/// A place kernels run: the CPU, the Neural Engine, or its emulator.
pub trait Backend: Send + Sync {
    /// Short name for logs and errors (`cpu`, `ane`, `ane-emu`).
    fn name(&self) -> &str;
    /// Most lanes one dispatch takes (32 on the ANE, large on the CPU).
    fn max_lanes(&self) -> usize;
    /// Compile a kernel with its weights baked in.
    fn compile(&self, spec: &KernelSpec, weights: &Arc<dyn TensorStore>) -> Result<Box<dyn Kernel>>;
}

/// A compiled kernel.
pub trait Kernel: Send + Sync {
    /// Input and output widths (channels).
    fn shape(&self) -> KernelShape;
    /// inputs: x (and r for residual kernels); out: y. All `Batch` lanes × channels; `out` is
    /// resized to x's lanes × output channels.
    fn run(&self, inputs: &[&Batch], out: &mut Batch) -> Result<Dispatch>;
}

/// Channel widths of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelShape {
    /// Channels of x.
    pub input: usize,
    /// Channels of y (and of r, for residual kernels).
    pub output: usize,
}
