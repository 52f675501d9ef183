//! One description of the kernels a decoder compiles, from its configuration alone (no
//! weights): per layer, each kernel's role, its [`KernelSpec`], the weight matrices it reads
//! with the shapes the configuration implies, and its output rows and input columns; then the
//! LM head.
//!
//! Each architecture builds its list (`kernel_specs`); loading compiles exactly this list
//! ([`crate::arch::kernel_compile`]), and `anelm plan` plans it ([`KernelList::model_kernels`]),
//! so the planner and the loaded model cannot disagree about which matrices a model has.

use anelm_ane::{AneKernel, KernelRole, LayerKind, ModelDims, ModelKernel, ModelKernels, ModelLayer};

use crate::arch::tensor_names::{LayerTensor, Tensor, TensorNames};
use crate::backend::{KernelSpec, WeightId};
use crate::error::Result;

/// One matrix a kernel reads, and the shape the configuration implies for it. `R` is the
/// family's tensor-role type: [`Tensor`] for the decoders, `BertTensor` for BERT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelWeight<R = Tensor> {
    /// Its role.
    pub tensor: R,
    /// Output rows.
    pub rows: usize,
    /// Input columns.
    pub cols: usize,
}

/// One kernel a model compiles.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelDesc<R = Tensor> {
    /// What it is for (the planner's role; the LM head is `LmHead { index: 0, count: 1 }`).
    pub role: KernelRole,
    /// What the backend compiles, with the weights' names in the file.
    pub spec: KernelSpec,
    /// The matrices the spec names, in its order, with their expected shapes.
    pub weights: Vec<KernelWeight<R>>,
    /// Output rows of the kernel.
    pub rows: usize,
    /// Input columns of the kernel (its first input, x).
    pub cols: usize,
}

/// The kernels of one layer, in dispatch order.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerKernels<R = Tensor> {
    /// Its mixer.
    pub kind: LayerKind,
    /// Its kernels.
    pub kernels: Vec<KernelDesc<R>>,
}

/// Every kernel a decoder compiles.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelList {
    /// One entry per layer.
    pub layers: Vec<LayerKernels>,
    /// The LM head, reading the output tensor (see [`KernelList::tie_lm_head`]).
    pub lm_head: KernelDesc,
}

impl KernelDesc {
    /// `[W1·x ; W2·x ; …]` over layer `layer`'s `parts` (role, rows), all `cols` wide.
    pub fn concat(
        role: KernelRole,
        names: &TensorNames,
        layer: usize,
        parts: &[(LayerTensor, usize)],
        cols: usize,
    ) -> Result<Self> {
        let ws = parts
            .iter()
            .map(|&(t, _)| names.weight(layer, t))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            role,
            spec: KernelSpec::Concat { ws },
            weights: parts
                .iter()
                .map(|&(t, rows)| KernelWeight {
                    tensor: Tensor::Layer(layer, t),
                    rows,
                    cols,
                })
                .collect(),
            rows: parts.iter().map(|&(_, r)| r).sum(),
            cols,
        })
    }

    /// The fused q ‖ k ‖ v input projection of layer `layer`: `q_rows` query rows and `kv_rows`
    /// each of key and value, `hidden` wide.
    pub fn qkv(names: &TensorNames, layer: usize, q_rows: usize, kv_rows: usize, hidden: usize) -> Result<Self> {
        use LayerTensor::{AttnK, AttnQ, AttnV};
        Self::concat(
            KernelRole::InputProj,
            names,
            layer,
            &[(AttnQ, q_rows), (AttnK, kv_rows), (AttnV, kv_rows)],
            hidden,
        )
    }

    /// `W·x` (`residual` false) or `r + W·x` (true) over layer `layer`'s `t`, `rows × cols`.
    pub fn linear(
        role: KernelRole,
        names: &TensorNames,
        layer: usize,
        t: LayerTensor,
        rows: usize,
        cols: usize,
        residual: bool,
    ) -> Result<Self> {
        let w = names.weight(layer, t)?;
        Ok(Self {
            role,
            spec: if residual {
                KernelSpec::LinearResidual { w }
            } else {
                KernelSpec::Linear { w }
            },
            weights: vec![KernelWeight {
                tensor: Tensor::Layer(layer, t),
                rows,
                cols,
            }],
            rows,
            cols,
        })
    }

    /// The SwiGLU FFN plus residual of layer `layer`: `hidden → inter → hidden`.
    pub fn swiglu_residual(names: &TensorNames, layer: usize, hidden: usize, inter: usize) -> Result<Self> {
        use LayerTensor::{FfnDown, FfnGate, FfnUp};
        let w = |t: LayerTensor, rows: usize, cols: usize| KernelWeight {
            tensor: Tensor::Layer(layer, t),
            rows,
            cols,
        };
        Ok(Self {
            role: KernelRole::FfnResidual,
            spec: KernelSpec::SwiGluResidual {
                gate: names.weight(layer, FfnGate)?,
                up: names.weight(layer, FfnUp)?,
                down: names.weight(layer, FfnDown)?,
            },
            weights: vec![
                w(FfnGate, inter, hidden),
                w(FfnUp, inter, hidden),
                w(FfnDown, hidden, inter),
            ],
            rows: hidden,
            cols: hidden,
        })
    }

    /// Expert `expert` of layer `layer`'s mixture-of-experts FFN: its gate ‖ up projection
    /// (`FfnGateUp`, the SwiGLU on the host) and its down projection (`FfnDown`, no residual: the
    /// host weighs and sums the chosen experts' outputs).
    pub fn expert(names: &TensorNames, layer: usize, expert: usize, hidden: usize, inter: usize) -> Result<[Self; 2]> {
        use crate::arch::tensor_names::ExpertTensor::{Down, Gate, Up};
        let t = |m| Tensor::Expert(layer, expert, m);
        let id = |m| names.name(t(m)).map(WeightId::new);
        let w = |m, rows, cols| KernelWeight {
            tensor: t(m),
            rows,
            cols,
        };
        Ok([
            Self {
                role: KernelRole::FfnGateUp,
                spec: KernelSpec::Concat {
                    ws: vec![id(Gate)?, id(Up)?],
                },
                weights: vec![w(Gate, inter, hidden), w(Up, inter, hidden)],
                rows: 2 * inter,
                cols: hidden,
            },
            Self {
                role: KernelRole::FfnDown,
                spec: KernelSpec::Linear { w: id(Down)? },
                weights: vec![w(Down, hidden, inter)],
                rows: hidden,
                cols: inter,
            },
        ])
    }

    /// The `vocab × hidden` LM head over the output tensor.
    pub fn lm_head(names: &TensorNames, vocab: usize, hidden: usize) -> Result<Self> {
        Ok(Self {
            role: KernelRole::LmHead { index: 0, count: 1 },
            spec: KernelSpec::LmHead {
                w: WeightId::new(names.name(Tensor::Output)?),
            },
            weights: vec![KernelWeight {
                tensor: Tensor::Output,
                rows: vocab,
                cols: hidden,
            }],
            rows: vocab,
            cols: hidden,
        })
    }
}

impl<R> KernelDesc<R> {
    /// The planner's shape of this kernel, whole.
    pub fn ane_kernel(&self) -> AneKernel {
        let (rows, cols) = (self.rows, self.cols);
        let first_rows = self.weights.first().map_or(0, |w| w.rows);
        match self.spec {
            KernelSpec::Linear { .. } => AneKernel::Linear { rows, cols },
            KernelSpec::LmHead { .. } => AneKernel::LmHeadChunk { rows, cols },
            KernelSpec::Concat { .. } => AneKernel::FusedLinear {
                parts: self.weights.iter().map(|w| w.rows).collect(),
                cols,
            },
            KernelSpec::LinearResidual { .. } => AneKernel::LinearResidual { rows, cols },
            KernelSpec::SwiGluResidual { .. } => AneKernel::SwiGluFfnResidual {
                hidden: cols,
                inter: first_rows,
            },
            KernelSpec::SwiGluAccumulate { .. } => AneKernel::FfnChunk {
                hidden: cols,
                chunk: first_rows,
            },
        }
    }

    /// The planner's view: role and whole shape.
    pub fn model_kernel(&self) -> ModelKernel {
        ModelKernel {
            role: self.role,
            kernel: self.ane_kernel(),
        }
    }
}

impl KernelList {
    /// Point the LM head at the token embedding: the file ties them (it has no output tensor).
    pub fn tie_lm_head(&mut self, names: &TensorNames) -> Result<()> {
        self.lm_head.spec = KernelSpec::LmHead {
            w: WeightId::new(names.name(Tensor::TokenEmbedding)?),
        };
        for w in &mut self.lm_head.weights {
            w.tensor = Tensor::TokenEmbedding;
        }
        Ok(())
    }

    /// Every kernel in load order: the layers', then the LM head.
    pub fn kernels(&self) -> impl Iterator<Item = &KernelDesc> {
        self.layers.iter().flat_map(|l| &l.kernels).chain([&self.lm_head])
    }

    /// What `anelm plan` plans: these kernels, with `dims` for the host work between them.
    pub fn model_kernels(&self, dims: ModelDims) -> ModelKernels {
        ModelKernels {
            dims,
            layers: self
                .layers
                .iter()
                .map(|l| ModelLayer {
                    kind: l.kind,
                    kernels: l.kernels.iter().map(KernelDesc::model_kernel).collect(),
                })
                .collect(),
            lm_head: self.lm_head.model_kernel(),
        }
    }
}
