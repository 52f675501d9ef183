//! Model forwards per architecture, and the pieces they share.

pub mod attention;
pub mod gemma3;
pub mod llama;
pub(crate) mod step;
