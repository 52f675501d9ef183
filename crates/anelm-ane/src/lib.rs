//! The ANE path of anelm: surfaces, kernel lowering, the model planner, and the emulated
//! Neural Engine.
//!
//! * [`Surface`] — the fp16 `[1, C, 1, 32]` I/O layout (element (c, lane) at halfword
//!   `c·32 + lane`), with round-to-nearest-even packing of up to 32 lanes.
//! * [`AneKernel`] + [`lower`] — a kernel of the catalogue and its f32 weights become a MIL
//!   [`anelm_mil::Program`] plus [`anelm_mil::WeightFiles`] (fp16, or int8 with fp16 scales).
//! * [`plan`] / [`plan_model`] — which kernels each layer of a model gets, and why (`anelm plan`).
//! * [`ProgramBuilder`] — one kernel's f32 weights to loaded programs on a device (row chunks, the
//!   FFN's split, the fallback chain); [`ProgramLayout::run`] runs them over up to 32 lanes.
//! * [`AneDevice`] / [`EmuAne`] — the device seam and the emulated Neural Engine, which accepts
//!   only MIL text and blob bytes, refuses what the hardware rejects or runs wrongly (each
//!   refusal names a [`Rule`]), runs accepted programs in fp16 and charges a virtual clock per
//!   [`ChipProfile`].
//!
//! ```
//! use anelm_ane::{AneDevice, AneKernel, EmuAne, Surface, WeightMode, lower};
//! let k = AneKernel::Linear { rows: 2, cols: 3 };
//! let w = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0];
//! let low = lower(&k, &[&w], WeightMode::Fp16).unwrap();
//! let ane = EmuAne::default();
//! let h = ane.compile(&low.mil_text(), &low.weights).unwrap();
//! ane.load(h).unwrap();
//! let x = Surface::pack(3, &[&[1.0, 2.0, 3.0]]).unwrap();
//! let mut y = [Surface::new(2)];
//! ane.evaluate(h, &[&x], &mut y).unwrap();
//! assert_eq!(y[0].read_lane(0).unwrap(), vec![1.0, 5.0]);
//! ```

// Only the `apple` module (the private framework through the Objective-C runtime) has unsafe code.
#![deny(unsafe_code)]
#![warn(missing_docs)]

#[allow(unsafe_code)]
pub mod apple;
mod cache;
mod chip;
mod device;
mod dispatch_sweep;
mod emu;
mod error;
mod exec;
mod kernel;
mod kernel_run;
mod limits;
mod lower;
mod plan;
mod plan_encoder;
mod plan_host;
mod plan_input;
mod plan_serve;
mod plan_speculate;
mod program_build;
mod quant;
mod rules;
mod surface;
mod surface_pool;
mod validate;

pub use apple::{AppleAne, AppleConfig, AppleError, Fallback, FfnForm, fallback};
pub use cache::{CACHE_DIR_ENV, CacheOutcome, CompileCache, compile_or_load, content_id};
pub use chip::{CHIPS, ChipProfile, FIT_TO_ANEMLL_RATIO, HostProfile, INT8_STREAM_EFFICIENCY, STREAM_TO_ANEMLL_RATIO};
pub use device::{
    AneDevice, CompileBudget, DispatchTime, ProgramHandle, Releasing, Signature, compile_and_load, smoke_dispatch,
};
pub use dispatch_sweep::{
    DEVICE_SWEEP_SIZES, DispatchFit, EMULATOR_SWEEP_SIZES, FitError, SweepError, SweepPoint, dispatch_sweep,
    fit_dispatch,
};
pub use emu::{DEFAULT_MAX_LOADED, EMU_REFUSE_ENV, EmuAne, EmuConfig, EmuStats};
pub use error::{AneError, LowerError, SurfaceError};
pub use kernel::{AneKernel, WeightMode, WeightShape};
pub use kernel_run::{LoadedProgram, ProgramLayout, RunCost, RunError};
pub use limits::{
    DEFAULT_MAX_CONV_INPUT_CHANNELS, DEFAULT_MAX_DIM, DEFAULT_MAX_KERNEL_CONST_BYTES, DEFAULT_MAX_TENSOR_ELEMENTS,
    FFN_MAX_BYTES, LM_HEAD_MAX_ROWS, Limits,
};
pub use lower::{FfnChunkWeights, Lowered, blob_path, ffn_chunk_weights, lower};
pub use plan::{
    BlockLayout, KernelRole, LayerKind, LayerPlan, LinearAttention, ModelDims, Plan, PlanError, PlanOptions,
    PlannedKernel, SlidingWindow, linear_chunk_rows, plan, plan_ffn, plan_model,
};
pub use plan_encoder::{EncoderDims, EncoderKernel, EncoderPlan, plan_encoder, plan_encoder_kernels};
pub use plan_host::{DEFAULT_CONTEXT, HostOptions, HostRuntime, StepCost, StreamWork, Work, stream_work};
pub use plan_input::{ModelKernel, ModelKernels, ModelLayer};
pub use plan_serve::ServeLoad;
pub use plan_speculate::{DEFAULT_ACCEPTANCE, MAX_PLANNED_DRAFTS, SpeculativeDecode, tokens_per_pass};
pub use program_build::{
    BuildCounters, BuildError, BuildStats, CompileForecast, FallbackHook, FfnWeights, KernelFallback, ProgramBuilder,
};
pub use quant::{QuantizedMatrix, quantize_int8};
pub use rules::{
    DEFAULT_MAX_COMPILES, FG_MAX_LOADED_BYTES, MAX_AXIS, MAX_PROGRAM_OUTPUTS, MAX_PROGRAM_WEIGHT_BYTES,
    MIN_SURFACE_BYTES, Rule, SURFACE_ALIGN_BYTES, group_alloc_size, surface_alloc_size, unsorted_pair,
};
pub use surface::{LANES, Surface, f32_to_fp16, fp16_to_f32};
pub use validate::WHITELIST;
