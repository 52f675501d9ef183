//! Model forwards per architecture.

pub mod llama;
