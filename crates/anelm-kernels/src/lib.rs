//! CPU numerics: tensor formats with llama.cpp's block layouts, dequantisation, and
//! matrix × activations "with lanes" (several activation rows per pass over the weights).
//! The arithmetic follows ggml's CPU path (activations quantised to the weight's dot format,
//! integer dots per block) so greedy output matches llama.cpp on the same file.

mod activations;
#[cfg(target_arch = "x86_64")]
mod attention_keys_x86;
mod attention_rows;
#[cfg(target_arch = "x86_64")]
mod attention_rows_x86;
mod bf16_matmul;
mod blocks;
mod dequant;
mod error;
mod exp;
mod f16_table;
mod features;
mod format;
mod fp16;
#[cfg(target_arch = "x86_64")]
mod lanes_x86;
#[cfg(target_arch = "x86_64")]
mod lanes_x86_int;
mod matmul;
mod packed;
mod packed_layout;
#[cfg(target_arch = "aarch64")]
mod packed_neon;
#[cfg(target_arch = "aarch64")]
mod packed_neon_dot;
#[cfg(target_arch = "aarch64")]
mod packed_neon_kquant;
mod packed_packer;
#[cfg(target_arch = "x86_64")]
mod packed_x86;
#[cfg(target_arch = "x86_64")]
mod packed_x86_ggml_order;
#[cfg(target_arch = "x86_64")]
mod packed_x86_kquant;
#[cfg(target_arch = "x86_64")]
mod packed_x86_q4_1;
#[cfg(target_arch = "x86_64")]
mod packed_x86_scaled;
#[cfg(target_arch = "x86_64")]
mod packed_x86_wide;
mod peak;
pub mod pool;
mod quantize;
mod scaled_blocks;
#[cfg(target_arch = "x86_64")]
mod scaled_blocks_x86;
#[cfg(target_arch = "aarch64")]
mod simd_neon;
#[cfg(target_arch = "x86_64")]
mod simd_x86;
mod vector;
mod weight_memory;

pub use activations::{Activations, BlockWriter};
pub use attention_rows::{CacheRows, dot_rows_group, weighted_rows_group};
pub use bf16_matmul::{Bf16Activations, Bf16Matrix};
pub use dequant::{dequantize_row, dot_reference};
pub use error::KernelError;
pub use exp::{exp_f32, silu_mul};
pub use f16_table::{F16_TABLE_LEN, f16_table_mul};
pub use features::{Features, Tuning};
pub use format::WeightFormat;
pub use fp16::{
    bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, f32_to_f16_slice, round_bf16, round_f16, round_f16_slice,
};
pub use matmul::{Isa, matmul, matmul_with};
pub use packed::{Combine, MAX_FUSED, PACK_ROWS, PackedMatrix, WIDE_GROUP_ROWS, wide_kernel_available};
pub use peak::ComputeUnit;
pub use quantize::quantize_row;
#[cfg(target_arch = "x86_64")]
pub use vector::{avx2, avx2_fma, avx512};
pub use vector::{axpy_f32, dot_f32};
