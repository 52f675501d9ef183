//! The planner's input: the kernels a model compiles, layer by layer, before the planner splits
//! them into ANE-sized pieces, plus the shapes of the host work between them ([`ModelDims`]).
//!
//! The engine builds this from its own description of each architecture (the kernels its loader
//! compiles), so the plan and the loaded model cannot disagree about which matrices exist.
//! [`ModelDims::kernels`] derives the same list from the shapes alone, for models described by
//! hand (this crate's tests, the calibration table); the engine's tests check the two agree for
//! every architecture.

use crate::kernel::AneKernel;
use crate::plan::{BlockLayout, KernelRole, LayerKind, ModelDims};

/// One kernel a model compiles, whole: the planner may split it (an FFN over the size limit
/// into chunks, the LM head into row chunks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelKernel {
    /// What it is for: [`KernelRole::InputProj`], [`KernelRole::OutputProjResidual`],
    /// [`KernelRole::OutputProj`], [`KernelRole::FfnGateUp`], [`KernelRole::FfnDown`],
    /// [`KernelRole::FfnResidual`] or, for the LM head, `LmHead { index: 0, count: 1 }`.
    pub role: KernelRole,
    /// Its shape: [`AneKernel::FusedLinear`], [`AneKernel::Linear`],
    /// [`AneKernel::LinearResidual`], [`AneKernel::SwiGluFfnResidual`] or, for the LM head,
    /// [`AneKernel::LmHeadChunk`] with every vocabulary row.
    pub kernel: AneKernel,
}

/// The kernels of one layer, in dispatch order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelLayer {
    /// Its mixer.
    pub kind: LayerKind,
    /// Its kernels.
    pub kernels: Vec<ModelKernel>,
}

/// What the planner plans: every layer's kernels, the LM head, and the host-work shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelKernels {
    /// Heads, head widths, DeltaNet sizes, sliding window, block layout: what the host does
    /// between the dispatches, and the report's header.
    pub dims: ModelDims,
    /// One entry per layer.
    pub layers: Vec<ModelLayer>,
    /// The whole LM head (`vocab × hidden`).
    pub lm_head: ModelKernel,
}

impl ModelDims {
    /// The kernels a model of these shapes whose layers are `kinds` compiles, derived from the
    /// shapes alone (models described by hand): per layer a fused input projection (q ‖ k ‖ v,
    /// or DeltaNet's qkv ‖ z ‖ b ‖ a), the output projection (with the residual add, or plain in
    /// the sandwich block), and the FFN (SwiGLU with the residual add, or gate ‖ up and a plain
    /// down projection in the sandwich block).
    pub fn kernels(&self, kinds: &[LayerKind]) -> ModelKernels {
        let layers = kinds
            .iter()
            .map(|&kind| {
                let mut kernels = vec![self.input_proj(kind), self.output_proj(kind)];
                kernels.extend(self.ffn());
                ModelLayer { kind, kernels }
            })
            .collect();
        ModelKernels {
            dims: *self,
            layers,
            lm_head: ModelKernel {
                role: KernelRole::LmHead { index: 0, count: 1 },
                kernel: AneKernel::LmHeadChunk {
                    rows: self.vocab,
                    cols: self.hidden,
                },
            },
        }
    }

    fn input_proj(&self, kind: LayerKind) -> ModelKernel {
        let parts = match (kind, self.linear_attention) {
            (LayerKind::LinearAttention, Some(la)) => {
                let k = la.key_heads * la.key_head_dim;
                let v = la.value_heads * la.value_head_dim;
                vec![2 * k + v, v, la.value_heads, la.value_heads]
            }
            (LayerKind::ShortConv, _) => vec![3 * self.hidden],
            _ => {
                let q = self.heads * self.head_dim * if self.attn_output_gate { 2 } else { 1 };
                let kv = self.kv_heads * self.head_dim;
                vec![q, kv, kv]
            }
        };
        ModelKernel {
            role: KernelRole::InputProj,
            kernel: AneKernel::FusedLinear {
                parts,
                cols: self.hidden,
            },
        }
    }

    fn output_proj(&self, kind: LayerKind) -> ModelKernel {
        let cols = match (kind, self.linear_attention) {
            (LayerKind::LinearAttention, Some(la)) => la.value_heads * la.value_head_dim,
            (LayerKind::ShortConv, _) => self.hidden,
            _ => self.heads * self.head_dim,
        };
        let rows = self.hidden;
        match self.block {
            BlockLayout::PreNorm => ModelKernel {
                role: KernelRole::OutputProjResidual,
                kernel: AneKernel::LinearResidual { rows, cols },
            },
            BlockLayout::Sandwich => ModelKernel {
                role: KernelRole::OutputProj,
                kernel: AneKernel::Linear { rows, cols },
            },
        }
    }

    fn ffn(&self) -> Vec<ModelKernel> {
        let (h, f) = (self.hidden, self.intermediate);
        match self.block {
            BlockLayout::PreNorm => vec![ModelKernel {
                role: KernelRole::FfnResidual,
                kernel: AneKernel::SwiGluFfnResidual { hidden: h, inter: f },
            }],
            BlockLayout::Sandwich => vec![
                ModelKernel {
                    role: KernelRole::FfnGateUp,
                    kernel: AneKernel::FusedLinear {
                        parts: vec![f, f],
                        cols: h,
                    },
                },
                ModelKernel {
                    role: KernelRole::FfnDown,
                    kernel: AneKernel::Linear { rows: h, cols: f },
                },
            ],
        }
    }
}
