//! The hardware rules the emulated ANE enforces, each with its evidence and what to do instead.
//!
//! A program that breaks one of these is refused at compile (or load) time with an error that
//! names the rule. On real hardware most of them do not fail loudly: the program compiles and
//! then returns garbage, poisons the process, or ignores an input (`ane-hardware.md` §3.6–3.8,
//! §8). Refusing them here turns silent corruption into a test failure.

use std::fmt;

/// One rule of the emulated ANE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// `program(1.0)` + `func main<ios16|ios18>` or `program(1.3)` + `main<ios18>`, with a
    /// `buildInfo` `coremlc-version` entry and exactly one function, `main`.
    Dialect,
    /// Every runtime input and output is fp16.
    IoFp16,
    /// Every runtime input and output is rank 4 `[1, C, 1, W]`.
    IoShape,
    /// Every runtime input and output has W (last dim) ≥ 32.
    IoLanes,
    /// No `tile` anywhere.
    NoTile,
    /// A `conv` weight is a compile-time constant (`const` or a `constexpr_*` of constants), and
    /// so is every operand of a `constexpr_*` op.
    ConvConstWeight,
    /// A `conv` is 1×1, stride 1, dilation 1, `pad_type = "valid"`, groups 1.
    ConvForm,
    /// Only whitelisted ops.
    OpWhitelist,
    /// Compute is fp16; int8 appears only as the data of `constexpr_blockwise_shift_scale`.
    Fp16Compute,
    /// Every BLOBFILE names a provided one-tensor file at offset 64 whose headers validate and
    /// whose payload holds exactly the declared tensor.
    BlobHeader,
    /// No tensor dimension above the per-op cap; no conv input width above the conv cap.
    DimCap,
    /// The program's constants fit the per-kernel size limit.
    KernelSize,
    /// No more simultaneously loaded programs than the per-process budget.
    LoadBudget,
}

impl Rule {
    /// Every rule, in check order.
    pub const ALL: [Rule; 13] = [
        Rule::Dialect,
        Rule::IoFp16,
        Rule::IoShape,
        Rule::IoLanes,
        Rule::NoTile,
        Rule::OpWhitelist,
        Rule::ConvConstWeight,
        Rule::ConvForm,
        Rule::Fp16Compute,
        Rule::DimCap,
        Rule::KernelSize,
        Rule::BlobHeader,
        Rule::LoadBudget,
    ];

    /// Stable kebab-case name, as errors and the field guide cite it.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Dialect => "mil-dialect",
            Rule::IoFp16 => "io-fp16",
            Rule::IoShape => "io-shape",
            Rule::IoLanes => "io-lanes-32",
            Rule::NoTile => "no-tile",
            Rule::ConvConstWeight => "conv-const-weight",
            Rule::ConvForm => "conv-1x1",
            Rule::OpWhitelist => "op-whitelist",
            Rule::Fp16Compute => "fp16-compute",
            Rule::BlobHeader => "blob-header",
            Rule::DimCap => "dim-cap",
            Rule::KernelSize => "kernel-size",
            Rule::LoadBudget => "load-budget",
        }
    }

    /// What to do instead.
    pub fn advice(self) -> &'static str {
        match self {
            Rule::Dialect => {
                "emit program(1.0) with func main<ios16> (fp16) or main<ios18> (int8) and the buildInfo \
                 coremlc-version entry, as anelm's lowering does"
            }
            Rule::IoFp16 => "declare every function input and output as fp16 and convert on the host",
            Rule::IoShape => "declare runtime tensors as [1, C, 1, 32] surfaces",
            Rule::IoLanes => {
                "pad the lane axis to 32: with W < 32 the hardware compiles and evaluates but returns garbage"
            }
            Rule::NoTile => {
                "replicate with concat(values = (x, x, …)) or on the CPU: after one tile evaluates, every later \
                 evaluation in the process fails with status 0x1d"
            }
            Rule::ConvConstWeight => {
                "bake the weight in as a BLOBFILE const (or use matmul for runtime operands): a runtime conv \
                 weight is silently ignored"
            }
            Rule::ConvForm => "use a 1×1 conv with strides [1, 1], dilations [1, 1], pad_type \"valid\" and groups 1",
            Rule::OpWhitelist => {
                "use only ops verified on hardware (const, conv, matmul, add, sub, mul, pow, sigmoid, silu, \
                 softmax, concat, slice_by_index, slice_by_size, reshape, transpose, reduce_sum, \
                 constexpr_blockwise_shift_scale) or run the step on the CPU"
            }
            Rule::Fp16Compute => {
                "keep runtime values fp16; store int8 weights only as constexpr_blockwise_shift_scale data \
                 with fp16 scales"
            }
            Rule::BlobHeader => {
                "write each weight with anelm_mil::write_blob (one tensor per file, chunk header at 64, \
                 payload at 128) and reference it at offset 64"
            }
            Rule::DimCap => {
                "split the op: LM heads go in row chunks of at most 65,536, wide inputs into chunks the conv \
                 cap allows"
            }
            Rule::KernelSize => "split the kernel (FFN chunks with the accumulator, LM head row chunks)",
            Rule::LoadBudget => "unload programs that are not needed, or split the model over processes",
        }
    }

    /// Where the rule comes from.
    pub fn evidence(self) -> &'static str {
        match self {
            Rule::Dialect => "ane-hardware.md §3.1, §8.1; ane-runtime.md §3.1",
            Rule::IoFp16 => "ane-runtime.md §3.1 (all runtime tensors fp16); FG: all I/O must be FP16",
            Rule::IoShape => "ane-hardware.md §8.3 (rank-4 [N, C, H, W], dense, W innermost)",
            Rule::IoLanes => "ane-hardware.md §3.8 (FG test_dynamic6/8/9: W = 16 and W = 1 fail)",
            Rule::NoTile => "ane-hardware.md §3.7 (FG test_dynamic13/14/16: the tile poison)",
            Rule::ConvConstWeight => "ane-hardware.md §3.6 (runtime conv weight ignored, stale data)",
            Rule::ConvForm => "ane-hardware.md §8.3 (1×1 conv, stride 1, pad 0, valid, dilation 1)",
            Rule::OpWhitelist => {
                "ane-hardware.md §8.5 tier 1, plus slice_by_index and constexpr_blockwise_shift_scale used in \
                 production by ane.cpp on M3 Max (ane-runtime.md §3.3, §3.6)"
            }
            Rule::Fp16Compute => "ane-hardware.md §8.4",
            Rule::BlobHeader => "ane-runtime.md §4; ane-hardware.md §2.1, §8.2 (strict mode)",
            Rule::DimCap => {
                "DESIGN.md (65,536-row LM-head chunks: the per-op cap); ane-hardware.md §3.6 (conv with \
                 IC = 32000 rejected)"
            }
            Rule::KernelSize => {
                "ane-hardware.md §8.3 (no recorded hard limit; configurable maximum); default = the largest \
                 kernel known to run, a 65,536 × 4096 fp16 LM-head chunk (ane-runtime.md §3.4)"
            }
            Rule::LoadBudget => "ane-runtime.md §2.5; ane-hardware.md §4.7, §8.6",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
