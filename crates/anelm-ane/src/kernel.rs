//! What to compile: the kernel catalogue of `ane-runtime.md` §3.3 as shapes only.
//!
//! An [`AneKernel`] names one ANE program by its dimensions; weights are supplied separately
//! (as f32 rows) when it is lowered, so the planner can reason about kernels from a model's
//! config alone. All runtime tensors are fp16 surfaces `[1, C, 1, 32]`.

use std::fmt;

use crate::surface::LANES;

/// How weight constants are stored in the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightMode {
    /// fp16 constants (`func main<ios16>`), rounded to nearest even from f32.
    #[default]
    Fp16,
    /// int8 rows with fp16 scales, dequantised at compile time by
    /// `constexpr_blockwise_shift_scale` (`func main<ios18>`). Symmetric, no zero point.
    Int8 {
        /// Columns per scale along the input axis; `None` = one scale per row (the reference).
        /// Must divide the input width of every weight of the kernel.
        block: Option<usize>,
    },
}

impl WeightMode {
    /// int8 with one scale per output row, as the C++ system quantises (`ane-runtime.md` §3.6).
    pub const INT8_PER_ROW: WeightMode = WeightMode::Int8 { block: None };

    /// Stored bytes of one `[rows, cols]` weight: fp16 data, or int8 data plus fp16 scales.
    pub fn weight_bytes(self, rows: usize, cols: usize) -> usize {
        match self {
            WeightMode::Fp16 => rows * cols * 2,
            WeightMode::Int8 { block } => {
                let per_row = block.filter(|&b| b > 0 && b < cols).map_or(1, |b| cols.div_ceil(b));
                rows * cols + rows * per_row * 2
            }
        }
    }

    /// Short name (`fp16`, `int8`, `int8/b64`).
    pub fn label(self) -> String {
        match self {
            WeightMode::Fp16 => "fp16".into(),
            WeightMode::Int8 { block: None } => "int8".into(),
            WeightMode::Int8 { block: Some(b) } => format!("int8/b{b}"),
        }
    }
}

impl fmt::Display for WeightMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// One weight matrix a kernel bakes in: its blob base name and `[rows, cols]` (PyTorch
/// `[out, in]`, row-major).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightShape {
    /// Base name of the const and its blob file(s) (`weight`, `wa`, `wg`, `oproj`, …).
    pub name: String,
    /// Output rows.
    pub rows: usize,
    /// Input columns.
    pub cols: usize,
}

/// One ANE program of the kernel catalogue, by shape. Weights are given at lowering time in
/// the order of [`AneKernel::weights`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AneKernel {
    /// `y = W·x` (reference `matmul`). Weight `weight [rows, cols]`.
    Linear {
        /// Output channels.
        rows: usize,
        /// Input channels.
        cols: usize,
    },
    /// `y = [W_a·x ; W_b·x ; …]` (reference `fused_2` / `fused_3`: the fused input projection).
    /// Weights `wa`, `wb`, … with `parts[k]` rows each.
    FusedLinear {
        /// Rows of each projection, in output order.
        parts: Vec<usize>,
        /// Input channels (shared).
        cols: usize,
    },
    /// `y = r + W·x` (reference `oproj_add`). Inputs `attn [cols]`, `xres [rows]`. Weight `oproj`.
    LinearResidual {
        /// Output channels (= residual width).
        rows: usize,
        /// Input channels.
        cols: usize,
    },
    /// `y = D·(silu(G·x) ⊙ U·x)` (reference `fused_ffn`). Weights `wg [inter, hidden]`,
    /// `wu [inter, hidden]`, `wd [hidden, inter]`.
    SwiGluFfn {
        /// Model width.
        hidden: usize,
        /// FFN width.
        inter: usize,
    },
    /// `y = r + D·(silu(G·x) ⊙ U·x)` (reference `fused_ffn_resadd`). Inputs `xnorm`, `xres`.
    SwiGluFfnResidual {
        /// Model width.
        hidden: usize,
        /// FFN width.
        inter: usize,
    },
    /// One chunk of a split FFN with the on-ANE accumulator (reference `ffn_chunk_accum`):
    /// input `packed [2·hidden]` = x ‖ acc, output `acc + D_c·(silu(G_c·x) ⊙ U_c·x)`. Weights
    /// `wg [chunk, hidden]`, `wu [chunk, hidden]`, `wd [hidden, chunk]` (see
    /// [`crate::ffn_chunk_weights`]). Feeding the residual as chunk 0's accumulator makes the
    /// last chunk's output `x + FFN(x)`.
    FfnChunk {
        /// Model width.
        hidden: usize,
        /// Intermediate rows in this chunk.
        chunk: usize,
    },
    /// A row chunk of the LM head: the same program as [`AneKernel::Linear`].
    LmHeadChunk {
        /// Vocabulary rows in this chunk.
        rows: usize,
        /// Model width.
        cols: usize,
    },
}

impl AneKernel {
    /// Short kind name (`linear`, `fused_linear`, `linear_residual`, `swiglu_ffn`,
    /// `swiglu_ffn_residual`, `ffn_chunk`, `lm_head_chunk`).
    pub fn kind(&self) -> &'static str {
        match self {
            AneKernel::Linear { .. } => "linear",
            AneKernel::FusedLinear { .. } => "fused_linear",
            AneKernel::LinearResidual { .. } => "linear_residual",
            AneKernel::SwiGluFfn { .. } => "swiglu_ffn",
            AneKernel::SwiGluFfnResidual { .. } => "swiglu_ffn_residual",
            AneKernel::FfnChunk { .. } => "ffn_chunk",
            AneKernel::LmHeadChunk { .. } => "lm_head_chunk",
        }
    }

    /// The weights this kernel bakes in, in the order [`crate::lower`] expects them.
    pub fn weights(&self) -> Vec<WeightShape> {
        let w = |name: &str, rows: usize, cols: usize| WeightShape {
            name: name.to_string(),
            rows,
            cols,
        };
        match self {
            AneKernel::Linear { rows, cols } | AneKernel::LmHeadChunk { rows, cols } => vec![w("weight", *rows, *cols)],
            AneKernel::FusedLinear { parts, cols } => parts
                .iter()
                .enumerate()
                .map(|(k, &rows)| w(&part_name(k), rows, *cols))
                .collect(),
            AneKernel::LinearResidual { rows, cols } => vec![w("oproj", *rows, *cols)],
            AneKernel::SwiGluFfn { hidden, inter } | AneKernel::SwiGluFfnResidual { hidden, inter } => vec![
                w("wg", *inter, *hidden),
                w("wu", *inter, *hidden),
                w("wd", *hidden, *inter),
            ],
            AneKernel::FfnChunk { hidden, chunk } => vec![
                w("wg", *chunk, *hidden),
                w("wu", *chunk, *hidden),
                w("wd", *hidden, *chunk),
            ],
        }
    }

    /// Channel counts of the runtime inputs, in surface order.
    pub fn input_channels(&self) -> Vec<usize> {
        match self {
            AneKernel::Linear { cols, .. } | AneKernel::LmHeadChunk { cols, .. } => vec![*cols],
            AneKernel::FusedLinear { cols, .. } => vec![*cols],
            AneKernel::LinearResidual { rows, cols } => vec![*cols, *rows],
            AneKernel::SwiGluFfn { hidden, .. } => vec![*hidden],
            AneKernel::SwiGluFfnResidual { hidden, .. } => vec![*hidden, *hidden],
            AneKernel::FfnChunk { hidden, .. } => vec![2 * hidden],
        }
    }

    /// Channel count of the single output.
    pub fn output_channels(&self) -> usize {
        match self {
            AneKernel::Linear { rows, .. } | AneKernel::LmHeadChunk { rows, .. } => *rows,
            AneKernel::FusedLinear { parts, .. } => parts.iter().sum(),
            AneKernel::LinearResidual { rows, .. } => *rows,
            AneKernel::SwiGluFfn { hidden, .. }
            | AneKernel::SwiGluFfnResidual { hidden, .. }
            | AneKernel::FfnChunk { hidden, .. } => *hidden,
        }
    }

    /// Number of weight elements.
    pub fn weight_elements(&self) -> usize {
        self.weights().iter().map(|w| w.rows * w.cols).sum()
    }

    /// Bytes of the weight constants as stored in `mode` (what each dispatch streams).
    pub fn weight_bytes(&self, mode: WeightMode) -> usize {
        self.weights().iter().map(|w| mode.weight_bytes(w.rows, w.cols)).sum()
    }

    /// Bytes of the weights once dequantised to fp16 (what the compiler may expand them to).
    pub fn fp16_weight_bytes(&self) -> usize {
        self.weight_elements() * 2
    }

    /// Bytes of all input and output surfaces at 32 lanes.
    pub fn io_bytes(&self) -> usize {
        (self.input_channels().iter().sum::<usize>() + self.output_channels()) * LANES * 2
    }

    /// Bytes one dispatch moves: weights in `mode` plus both surfaces (the basis of the cost
    /// model `fixed + bytes / bandwidth`).
    pub fn dispatch_bytes(&self, mode: WeightMode) -> usize {
        self.weight_bytes(mode) + self.io_bytes()
    }
}

impl fmt::Display for AneKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AneKernel::Linear { rows, cols } => write!(f, "linear {rows}×{cols}"),
            AneKernel::LmHeadChunk { rows, cols } => write!(f, "lm_head_chunk {rows}×{cols}"),
            AneKernel::FusedLinear { parts, cols } => {
                let p = parts.iter().map(usize::to_string).collect::<Vec<_>>().join("+");
                write!(f, "fused_linear ({p})×{cols}")
            }
            AneKernel::LinearResidual { rows, cols } => write!(f, "linear_residual {rows}×{cols} + r"),
            AneKernel::SwiGluFfn { hidden, inter } => write!(f, "swiglu_ffn {hidden}→{inter}→{hidden}"),
            AneKernel::SwiGluFfnResidual { hidden, inter } => {
                write!(f, "swiglu_ffn_residual {hidden}→{inter}→{hidden} + r")
            }
            AneKernel::FfnChunk { hidden, chunk } => write!(f, "ffn_chunk {hidden}→{chunk}→{hidden} + acc"),
        }
    }
}

/// `wa`, `wb`, … for fused projection parts (`w26`, `w27`, … past `wz`).
pub(crate) fn part_name(k: usize) -> String {
    match u8::try_from(k) {
        Ok(k) if k < 26 => format!("w{}", char::from(b'a' + k)),
        _ => format!("w{k}"),
    }
}
