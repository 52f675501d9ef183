//! Model files: GGUF and safetensors readers, configs, tokenizer and chat template.

pub mod chat_template;
pub mod encoder_tokenizer;
pub mod error;
pub mod gguf;
pub mod hf_config;
mod mapped_pages;
pub mod safetensors_dir;
pub mod sentence_config;
pub mod tensor_store;
pub mod tokenizer;
