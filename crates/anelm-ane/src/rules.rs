//! The hardware rules the emulated ANE enforces, each with its evidence and what to do instead.
//!
//! A program that breaks one of these is refused at compile (or load) time with an error that
//! names the rule. On real hardware most of them do not fail loudly: the program compiles and
//! then returns garbage, poisons the process, or ignores an input (`ane-hardware.md` §3.6–3.8,
//! §8). Refusing them here turns silent corruption into a test failure.

use std::fmt;

/// Most outputs one program may return ([`Rule::OutputCount`]).
pub const MAX_PROGRAM_OUTPUTS: usize = 2;

/// Smallest IOSurface allocation an evaluation accepts ([`Rule::SurfaceMinBytes`]): 49,152 bytes.
pub const MIN_SURFACE_BYTES: usize = 49_152;

/// Alignment of every IOSurface allocation, and on M5 of every I/O tensor's size
/// ([`Rule::M5Alignment`]): 128 bytes.
pub const SURFACE_ALIGN_BYTES: usize = 128;

/// Most weight-file bytes one program may hand the compiler ([`Rule::ProgramWeights`]): ~2 GB,
/// taken as 2 × 10⁹ (the lower reading of "about 2 GB").
pub const MAX_PROGRAM_WEIGHT_BYTES: u64 = 2_000_000_000;

/// Largest size of any one tensor axis ([`Rule::DimCap`]): 65,536.
pub const MAX_AXIS: usize = 65_536;

/// Compiles one process may make before the ANE compiler's leak breaks it ([`Rule::CompileBudget`]).
pub const DEFAULT_MAX_COMPILES: usize = 119;

/// Constant bytes one process may keep loaded on an M3 Max / macOS 26.3.1 ([`Rule::LoadedBytes`]),
/// ~3.5 GB.
pub const FG_MAX_LOADED_BYTES: u64 = 3_500_000_000;

/// The bytes to allocate for an IOSurface carrying `tensor_bytes`: at least
/// [`MIN_SURFACE_BYTES`], rounded up to a multiple of [`SURFACE_ALIGN_BYTES`]. `None` on overflow.
pub fn surface_alloc_size(tensor_bytes: usize) -> Option<usize> {
    tensor_bytes
        .max(MIN_SURFACE_BYTES)
        .checked_next_multiple_of(SURFACE_ALIGN_BYTES)
}

/// The one allocation size of a group of IOSurfaces (a program's inputs, or its outputs) whose
/// tensors hold `tensor_bytes` each: [`surface_alloc_size`] of the largest
/// ([`Rule::SurfaceEqualAlloc`]). `None` for an empty group or on overflow.
pub fn group_alloc_size(tensor_bytes: impl IntoIterator<Item = usize>) -> Option<usize> {
    surface_alloc_size(tensor_bytes.into_iter().max()?)
}

/// The first pair of neighbouring names out of sorted (byte) order, if any
/// ([`Rule::IoSortedNames`]).
pub fn unsorted_pair<'a>(names: &[&'a str]) -> Option<(&'a str, &'a str)> {
    names.windows(2).find(|w| w[0] >= w[1]).map(|w| (w[0], w[1]))
}

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
    /// No tensor axis above the per-op cap (65,536); no conv input width above the conv cap.
    ///
    /// Evidence: landscape.md §2 ("per-op dimension cap of 65,536"; maderix/ANE#26 split a
    /// 151,936-row vocabulary into 16 chunks); ane-runtime.md §3.4 (ane.cpp's 65,536-row LM-head
    /// chunks run on M3 Max); ane-hardware.md §3.6 (a conv with 32,000 input channels is rejected).
    DimCap,
    /// The program's constants fit the per-kernel size limit.
    KernelSize,
    /// No more simultaneously loaded programs than the per-process budget.
    LoadBudget,
    /// At most [`MAX_PROGRAM_OUTPUTS`] (2) outputs per program.
    ///
    /// Evidence: issue 27's desk review of the public runtimes: with 3 or more outputs every
    /// output but the last comes back silently corrupted. Every verified anelm kernel returns one
    /// output. (Orion's docs/ane_constraints.md §2–3 adds that the outputs of a multi-output
    /// program need equal allocation sizes and arrive in alphabetical order of their names.)
    ///
    /// **Conservative** (issue 37 item 6): Orion returned 3 outputs intact once the surfaces were
    /// bound in sorted name order, so the corruption reported for 3+ outputs may have been the
    /// binding order ([`Rule::IoSortedNames`]). Kept until a Mac shows 3 sorted outputs work.
    OutputCount,
    /// Runtime inputs are declared in sorted order of their names (byte order), and so are the
    /// outputs: the framework binds a request's IOSurfaces to the program's symbols in sorted
    /// name order, whatever order the MIL declares them in.
    ///
    /// Evidence: Orion docs/ane_constraints.md §3 and §13 (M4 Max): outputs arrive, and inputs
    /// must be given, in alphabetical order of their MIL names; all 6 permutations of 3 inputs
    /// were tried and only the sorted one computed correctly. A public MLX/ANE bridge binds the
    /// same way (issue 37). Declaring them sorted makes declaration order, request order and the
    /// framework's order one order; the emulator binds by sorted name too.
    IoSortedNames,
    /// Every IOSurface an evaluation uses is at least [`MIN_SURFACE_BYTES`] (49,152) bytes.
    ///
    /// Evidence: Orion (arXiv 2603.06728; mechramc/Orion docs/ane_constraints.md §4, M4 Max):
    /// smaller allocations compile but fail at evaluation with status 0x1d; the smallest working
    /// one was [768, 16] fp16 = 49,152 bytes. The ANE reads the declared tensor packed from the
    /// start of a larger surface (same document, §14), so the fix is only to allocate more. This
    /// is a device rule: the Apple device allocates at least this much and refuses a smaller
    /// surface; the emulator has no IOSurfaces.
    ///
    /// **Conservative** (issue 37 item 6): measured on M4 Max only; maderix's M5 run evaluated
    /// 8 KB surfaces. Allocating more costs only host memory, so the minimum stays everywhere.
    SurfaceMinBytes,
    /// On M5, every runtime input and output tensor is a multiple of 128 bytes (and every
    /// IOSurface allocation is, on every chip).
    ///
    /// Evidence: maderix/ANE README, "Hardware Characterization: Apple M5" (macOS 26.3): "All
    /// input, output, and weight surfaces must be 128-byte aligned. Failure results in silent
    /// evaluation errors or compiler rejection"; landscape.md §2 ("M5 needs 128-byte IOSurface
    /// alignment"). The README's allocation helper aligns on every chip ("backward compatible
    /// with M3/M4"), so the Apple device always does.
    M5Alignment,
    /// Every input IOSurface of one program has the same allocation size, and so has every
    /// output (each tensor packed at the start of its surface). A device rule: the Apple device
    /// allocates each group at its largest member's size and refuses surfaces that come back
    /// unequal; the emulator has no IOSurfaces.
    ///
    /// Evidence: Orion docs/ane_constraints.md §2 (outputs) and §12 (inputs), M4 Max: unequal
    /// allocations compile and load but fail at evaluation with status 0x1d; §14: the ANE reads
    /// the declared tensor packed from the start of a larger surface. anelm's `linear_residual`
    /// kernel has unequal inputs (`attn` 4096 and `xres` 2560 channels for Qwen3.5-4B).
    SurfaceEqualAlloc,
    /// The weight files of one program total at most [`MAX_PROGRAM_WEIGHT_BYTES`] (~2 GB).
    ///
    /// Evidence: landscape.md §2 ("about 2 GB of baked-constant weights per compiled ANE program",
    /// sbryngelson/ANEForge#45, which segments 8B decode because of it); ANEMLL splits Core ML
    /// models at about 2 GB per file on macOS (landscape.md §2, ANEMLL docs/convert.md).
    ProgramWeights,
    /// No more compiles in one process than the compiler's budget (default
    /// [`DEFAULT_MAX_COMPILES`], 119); refused *before* the compile that would exceed it.
    ///
    /// Evidence: maderix/ANE README ("~119 compile limit — ANE compiler leaks resources; worked
    /// around via exec() restart"), ane-hardware.md §4.7 (MX budgets 100 and exec()s itself; M4,
    /// macOS 15), Orion docs/ane_constraints.md §5 (confirmed on M4 Max). Contradicted on M3 Max /
    /// macOS 26.3.1, where ane.cpp compiled Qwen3-4B's 226 kernels in one process
    /// (ane-hardware.md §4.7): the budget is configurable, and **conservative** (issue 37
    /// item 6). Programs loaded from the compile cache do not count, so a new process resumes
    /// where the last one stopped; the ANE backend treats a spent budget as a stop, never as a
    /// refusal of the form (issue 37 item 1).
    CompileBudget,
    /// No more loaded constant bytes per process than the configured budget (FG: ~3.5 GB,
    /// [`FG_MAX_LOADED_BYTES`]).
    ///
    /// Evidence: ane-hardware.md §4.7 and §8.6 (FG, M3 Max / macOS 26.3.1: ~50 kernels of ~70 MB
    /// or 15 FFNs of 135 MB hit the limit; unload reclaims it). Contradicted by the same system
    /// running Qwen3.5-4B fp16 (~8 GB of kernels) at 9.21 tok/s (ane-runtime.md §11), so the
    /// emulator leaves it off unless configured.
    LoadedBytes,
    /// A program form the emulator was told to refuse ([`crate::EmuConfig::refuse`]): a test knob
    /// standing in for a compiler that refuses some kernel form (an int8 `constexpr`, a fused
    /// FFN, a large LM-head chunk), so the fallback chain can be tested off a Mac.
    ///
    /// Evidence: issue 27 item 4 (public reports disagree on whether the in-memory compiler takes
    /// `constexpr_blockwise_shift_scale`); ane-runtime.md §2.6, §3.9 (the FFN and LM-head
    /// fallbacks of the C++ system).
    Refused,
}

impl Rule {
    /// Every rule: the program rules in the validator's check order, then the device rules
    /// (compile budget, load budgets, surface size).
    pub const ALL: [Rule; 22] = [
        Rule::Dialect,
        Rule::IoFp16,
        Rule::IoShape,
        Rule::IoLanes,
        Rule::OutputCount,
        Rule::IoSortedNames,
        Rule::M5Alignment,
        Rule::ProgramWeights,
        Rule::NoTile,
        Rule::OpWhitelist,
        Rule::ConvConstWeight,
        Rule::ConvForm,
        Rule::Fp16Compute,
        Rule::DimCap,
        Rule::KernelSize,
        Rule::BlobHeader,
        Rule::CompileBudget,
        Rule::LoadBudget,
        Rule::LoadedBytes,
        Rule::SurfaceMinBytes,
        Rule::SurfaceEqualAlloc,
        Rule::Refused,
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
            Rule::OutputCount => "io-outputs-2",
            Rule::IoSortedNames => "io-sorted-names",
            Rule::SurfaceEqualAlloc => "surface-equal-alloc",
            Rule::SurfaceMinBytes => "surface-min-bytes",
            Rule::M5Alignment => "m5-align-128",
            Rule::ProgramWeights => "program-weights-2gb",
            Rule::CompileBudget => "compile-budget",
            Rule::LoadedBytes => "loaded-bytes",
            Rule::Refused => "refused-form",
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
            Rule::OutputCount => {
                "return at most 2 outputs (concatenate along channels and slice on the host): with 3 or more, \
                 all but the last come back corrupted without an error"
            }
            Rule::IoSortedNames => {
                "declare the function's inputs (and its outputs) in sorted order of their names, or rename them \
                 so that sorted order is the intended order: the framework binds surfaces by sorted name"
            }
            Rule::SurfaceEqualAlloc => {
                "allocate every input surface of a program at the size of its largest input (and every output at \
                 the size of its largest output), each tensor packed at the start"
            }
            Rule::SurfaceMinBytes => {
                "allocate every IOSurface with at least 49,152 bytes (the tensor packed at its start): smaller \
                 ones fail at evaluation with status 0x1d"
            }
            Rule::M5Alignment => {
                "make every input and output tensor a multiple of 128 bytes (an even channel count at 32 lanes) \
                 and allocate surfaces in multiples of 128 bytes"
            }
            Rule::ProgramWeights => {
                "split the program's weights over several programs (FFN chunks, LM-head row chunks)"
            }
            Rule::CompileBudget => {
                "run anelm again: compiled programs stay in the OS compile cache, so a new process loads them \
                 without compiling and compiles only the rest (or raise the budget where the OS allows it)"
            }
            Rule::LoadedBytes => "unload programs that are not needed, or keep fewer weights on the Neural Engine",
            Rule::Refused => {
                "let the ANE backend fall back (int8 → fp16, FFN resadd → plain → chunked, LM head → CPU), or \
                 clear EmuConfig::refuse / ANELM_EMU_REFUSE"
            }
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
                "landscape.md §2 (per-op cap 65,536; maderix/ANE#26); DESIGN.md (65,536-row LM-head chunks); \
                 ane-hardware.md §3.6 (conv with IC = 32000 rejected)"
            }
            Rule::KernelSize => {
                "ane-hardware.md §8.3 (no recorded hard limit; configurable maximum); default = the largest \
                 kernel known to run, a 65,536 × 4096 fp16 LM-head chunk (ane-runtime.md §3.4)"
            }
            Rule::LoadBudget => "ane-runtime.md §2.5; ane-hardware.md §4.7, §8.6",
            Rule::OutputCount => "issue 27 desk review of the public runtimes (3+ outputs: all but the last corrupted)",
            Rule::IoSortedNames => "Orion docs/ane_constraints.md §3, §13 (M4 Max: binding by alphabetical name)",
            Rule::SurfaceEqualAlloc => {
                "Orion docs/ane_constraints.md §2, §12, §14 (M4 Max: status 0x1d on unequal sizes)"
            }
            Rule::SurfaceMinBytes => {
                "Orion (arXiv 2603.06728) docs/ane_constraints.md §4: 49,152 bytes minimum, M4 Max"
            }
            Rule::M5Alignment => "maderix/ANE README, M5 constraints table (macOS 26.3); landscape.md §2",
            Rule::ProgramWeights => "landscape.md §2 (sbryngelson/ANEForge#45: ~2 GB per program)",
            Rule::CompileBudget => {
                "maderix/ANE README (~119 compiles, compiler leak); ane-hardware.md §4.7; Orion \
                 docs/ane_constraints.md §5"
            }
            Rule::LoadedBytes => "ane-hardware.md §4.7, §8.6 (FG: ~3.5 GB on M3 Max / macOS 26.3.1)",
            Rule::Refused => "issue 27 item 4; ane-runtime.md §2.6, §3.9 (a test knob, not a hardware limit)",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
