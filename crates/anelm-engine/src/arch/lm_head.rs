//! The LM head every decoder compiles the same way: one `vocab × hidden` matrix (the output
//! tensor, or the tied embedding), its shape checked before the model is used.

use std::sync::Arc;

use anelm_model::tensor_store::TensorStore;

use crate::backend::{Backend, Kernel, KernelSpec, WeightId};
use crate::error::{EngineError, Result};

/// Compile `head_name` as the LM head; a matrix that is not `vocab × hidden` is a config error
/// naming it.
pub(crate) fn compile_lm_head(
    backend: &dyn Backend,
    store: &Arc<dyn TensorStore>,
    head_name: &str,
    vocab: usize,
    hidden: usize,
) -> Result<Box<dyn Kernel>> {
    let lm_head = backend.compile(
        &KernelSpec::LmHead {
            w: WeightId::new(head_name),
        },
        store,
    )?;
    let shape = lm_head.shape();
    if shape.output != vocab || shape.input != hidden {
        return Err(EngineError::Config(format!(
            "LM head '{head_name}' is {}×{}, expected {vocab}×{hidden}",
            shape.output, shape.input
        )));
    }
    Ok(lm_head)
}
