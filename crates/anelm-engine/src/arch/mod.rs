//! Model forwards per architecture, and the pieces they share.

pub mod attention;
pub mod bert;
pub mod bert_attention;
pub mod bert_head;
pub mod bert_tensors;
pub(crate) mod config_read;
pub mod decoder;
pub mod deltanet;
pub mod gemma3;
pub mod kernel_compile;
pub mod kernel_list;
pub mod lfm2;
pub mod llama;
pub mod modernbert;
pub mod modernbert_head;
pub mod moe;
pub mod qwen3_5;
pub mod registry;
pub mod step;
pub mod tensor_names;
pub(crate) mod trunk;
