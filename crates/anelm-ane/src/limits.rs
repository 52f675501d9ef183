//! The limits of one Neural Engine, in one type shared by the validator (which refuses programs
//! over them), the emulator (which enforces them), the planner (which shapes kernels under them)
//! and the ANE backend (which builds what the planner chose). Each default carries its evidence,
//! and [`Limits`] marks which are evidenced and which are conservative.
//!
//! The per-process and per-surface numbers live beside the rules ([`crate::rules`]): the compile
//! budget (119, **conservative**: maderix/Orion on M4, but ane.cpp compiled 226 kernels in one
//! process on M3 Max / macOS 26), the surface minimum (49,152 bytes, **conservative**: Orion on
//! M4 Max, while maderix's M5 run used 8 KB surfaces; a larger allocation only costs host
//! memory), the output count (2, **conservative**: Orion ran 3 outputs once they were in sorted
//! order, so the "3+ outputs corrupted" report may have been the binding order), the loaded-program
//! budget (229, **evidenced** on M3 Max), the sorted binding and equal allocations
//! (**evidenced**, Orion on M4 Max) and the M5 128-byte alignment (**evidenced**, maderix on M5).

use crate::rules::{MAX_AXIS, MAX_PROGRAM_WEIGHT_BYTES};

/// Largest tensor dimension the emulator accepts: the per-op cap of 65,536 per axis
/// ([`Rule::DimCap`] gives the evidence).
pub const DEFAULT_MAX_DIM: usize = MAX_AXIS;

/// Largest conv input width: 9216 is known to work (Qwen3.5-4B down projection, ane-runtime.md §3.4)
/// and 32,000 is rejected (ane-hardware.md §3.6); nothing is known in between, so 16,384.
pub const DEFAULT_MAX_CONV_INPUT_CHANNELS: usize = 16_384;

/// Largest constant payload per kernel (at fp16 size): the biggest fp16 kernel known to run at
/// the ANE's rate, a 65,536 × 2560 LM-head chunk of Qwen3.5-4B (335.5 MB; ane-runtime.md §3.4,
/// the 4B fp16 rows of §11). The 65,536 × 4096 fp16 chunks of Qwen3.5-9B (536.9 MB) are taken as
/// refused: the C++ system's 9B fp16 decode is 51 ms per token slower than its dispatches
/// explain, which is what its LM-head fallback to an fp32 CPU mat-vec costs (field guide,
/// 2026-12-06 evening). The true limit lies in (335.5 MB, 536.9 MB]; a Mac decides it.
pub const DEFAULT_MAX_KERNEL_CONST_BYTES: u64 = 65_536 * 2560 * 2;

/// Largest element count of any one tensor: the largest weight known to run (65,536 × 4096, the
/// Qwen3.5-9B LM-head chunk stored as int8).
pub const DEFAULT_MAX_TENSOR_ELEMENTS: usize = 65_536 * 4096;

/// The FFN size rule of the C++ system: `ANE_FFN_CHUNK_MAX_BYTES` = 150 MiB of fp16 weights
/// (`ane-runtime.md` §3.5; raised 48 → 72 → 150 MB as larger single kernels proved to work).
pub const FFN_MAX_BYTES: u64 = 150 * 1024 * 1024;

/// LM-head rows per chunk: 65,536 (`ane-runtime.md` §3.4; the per-op dimension cap).
pub const LM_HEAD_MAX_ROWS: usize = 65_536;

/// What one device accepts, and the two size choices the planner makes under it.
///
/// Each limit is marked **evidenced** (a public run on hardware shows it) or **conservative**
/// (anelm stays inside what is known to work; the true limit is unknown or lies further out, and
/// a Mac report can widen it). Issue 37 item 6 re-checked them against maderix/ANE, Orion's
/// `docs/ane_constraints.md` and ane.cpp; the field guide (2026-12-07, "a strict fake
/// framework") lists the sources per limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Per-op dimension cap ([`crate::Rule::DimCap`]). **Evidenced**: 65,536 (maderix/ANE#26;
    /// ane.cpp's 65,536-row LM-head chunks run on M3 Max).
    pub max_dim: usize,
    /// Conv input-channel cap ([`crate::Rule::DimCap`]). **Conservative**: 9,216 runs (ane.cpp,
    /// Qwen3.5-4B down projection) and 32,000 is rejected; 16,384 is a guess in between.
    pub max_conv_input_channels: usize,
    /// Element cap of any one tensor ([`crate::Rule::DimCap`]). **Conservative**: the largest
    /// weight known to run (65,536 × 4096 int8), not a measured limit.
    pub max_tensor_elements: usize,
    /// Per-kernel constant limit in bytes at fp16 size ([`crate::Rule::KernelSize`]).
    /// **Conservative**: the largest fp16 kernel known to run at the ANE's rate (335.5 MB); the
    /// true limit lies in (335.5 MB, 536.9 MB].
    pub max_kernel_const_bytes: u64,
    /// Most weight-file bytes one program may hand the compiler ([`crate::Rule::ProgramWeights`]).
    /// **Evidenced, approximately**: "about 2 GB" (sbryngelson/ANEForge#45), read as 2 × 10⁹.
    pub max_program_weight_bytes: u64,
    /// FFN split threshold, bytes of fp16 weights ([`FFN_MAX_BYTES`]; the planner's choice, not a
    /// device limit: ane.cpp raised it 48 → 72 → 150 MB as larger kernels proved to work).
    pub ffn_max_bytes: u64,
    /// LM-head rows per chunk ([`LM_HEAD_MAX_ROWS`]; the planner's choice at the evidenced
    /// per-op cap).
    pub lm_head_max_rows: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_dim: DEFAULT_MAX_DIM,
            max_conv_input_channels: DEFAULT_MAX_CONV_INPUT_CHANNELS,
            max_tensor_elements: DEFAULT_MAX_TENSOR_ELEMENTS,
            max_kernel_const_bytes: DEFAULT_MAX_KERNEL_CONST_BYTES,
            max_program_weight_bytes: MAX_PROGRAM_WEIGHT_BYTES,
            ffn_max_bytes: FFN_MAX_BYTES,
            lm_head_max_rows: LM_HEAD_MAX_ROWS,
        }
    }
}
