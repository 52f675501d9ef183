//! The engine's error type.

use anelm_kernels::KernelError;
use anelm_model::error::ModelError;

/// Everything that can fail while loading a model or running it.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A model file could not be read or is malformed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A numeric kernel rejected its inputs (a shape bug or a corrupt tensor).
    #[error("kernel error: {0}")]
    Kernel(#[from] KernelError),
    /// The tokenizer failed.
    #[error(transparent)]
    Tokenizer(#[from] anelm_model::tokenizer::TokenizerError),
    /// The chat template failed to compile or render.
    #[error(transparent)]
    Template(#[from] anelm_model::chat_template::TemplateError),
    /// The sampler was given invalid parameters or unusable logits.
    #[error(transparent)]
    Sampler(#[from] crate::sampler::SamplerError),
    /// An output constraint (grammar) is invalid or failed.
    #[error(transparent)]
    Constraint(#[from] crate::constraint::ConstraintError),
    /// The model's configuration is missing something or is inconsistent.
    #[error("model configuration: {0}")]
    Config(String),
    /// The model's architecture is not implemented.
    #[error("unsupported model architecture '{name}': anelm runs {known}")]
    UnsupportedArchitecture {
        /// The architecture the file names.
        name: String,
        /// The ones this kind of model can be.
        known: String,
    },
    /// A tensor has a shape other than the configuration implies.
    #[error(
        "tensor '{name}' has shape {found:?}, expected {expected:?}: the file does not match its own configuration"
    )]
    TensorShape {
        /// Tensor name as stored in the file.
        name: String,
        /// Shape found in the file (outermost first).
        found: Vec<usize>,
        /// Shape the configuration implies.
        expected: Vec<usize>,
    },
    /// A request does not fit the model or the session (too long, bad token id, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The session's context is full.
    #[error(
        "context full: {needed} tokens needed but the context holds {limit}; shorten the prompt or --max-tokens, or raise --ctx-size"
    )]
    ContextFull {
        /// Tokens the request needs in total.
        needed: usize,
        /// Context size of the session.
        limit: usize,
    },
    /// A backend failed to compile or run a kernel.
    #[error("backend '{backend}': {message}")]
    Backend {
        /// Backend name.
        backend: String,
        /// What went wrong.
        message: String,
    },
}

/// Result alias for the engine.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// `Ok` when the matrix `name` is `found` = (rows, cols) as the configuration `expected`, else
/// [`EngineError::TensorShape`] naming it: the one shape check of every place that holds a
/// matrix (the stored tensor, a CPU kernel's matrix, a dequantised ANE weight).
pub fn check_matrix_shape(name: &str, found: (usize, usize), expected: (usize, usize)) -> Result<()> {
    if found == expected {
        Ok(())
    } else {
        Err(EngineError::TensorShape {
            name: name.to_string(),
            found: vec![found.0, found.1],
            expected: vec![expected.0, expected.1],
        })
    }
}
