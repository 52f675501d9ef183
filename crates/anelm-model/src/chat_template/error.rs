//! Errors of chat-template compilation, loading and rendering.

use std::path::PathBuf;

/// What went wrong with a chat template.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template source does not parse.
    #[error("chat template does not compile: {message}; fix the template or pass a different one")]
    Parse {
        /// The parser's message, with the line where it failed.
        message: String,
    },
    /// The template called `raise_exception(msg)`, usually because the conversation
    /// does not fit the model's format (e.g. roles not alternating).
    #[error("chat template rejected the conversation: {0}")]
    Raised(String),
    /// Rendering failed for another reason (unknown filter, bad operation, ...).
    #[error("chat template failed to render: {message}")]
    Render {
        /// The engine's message, with the line where it failed.
        message: String,
    },
    /// A file of a Hugging Face model directory could not be read.
    #[error("cannot read {path}: {source}; check that the model directory is complete")]
    Io {
        /// The file that failed.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// tokenizer_config.json is malformed or its `chat_template` has an unknown shape.
    #[error("cannot use {path}: {message}")]
    Config {
        /// The file that failed.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
}
