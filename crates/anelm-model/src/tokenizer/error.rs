//! Errors of tokenizer loading, encoding and decoding.

use std::path::PathBuf;

/// What went wrong while building or using a [`super::Tokenizer`].
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The vocabulary metadata is inconsistent or incomplete.
    #[error("invalid tokenizer vocabulary: {0}; re-convert the model or report the file")]
    Vocab(String),
    /// `tokenizer.ggml.model` names a tokenizer kind this engine does not implement.
    #[error(
        "unsupported tokenizer model {0:?}: only \"gpt2\" (byte-level BPE) and \"llama\" (SentencePiece) are supported"
    )]
    UnsupportedModel(String),
    /// A file of a Hugging Face model directory could not be read.
    #[error("cannot read {path}: {source}; check that the model directory is complete")]
    Io {
        /// The file that failed.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A JSON file of a Hugging Face model directory is malformed.
    #[error("cannot parse {path}: {message}; the file is malformed or of an unknown version")]
    Json {
        /// The file that failed.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// The `tokenizers` library refused to build or run the tokenizer.
    #[error("tokenizer backend error: {0}")]
    Backend(String),
    /// Encoding hit text that the vocabulary cannot represent and there is no unknown token.
    #[error("cannot encode byte 0x{0:02X}: the vocabulary has neither a byte token for it nor an unknown token")]
    Unencodable(u8),
    /// A token id outside the vocabulary was given to decode.
    #[error("token id {id} is out of range: the vocabulary has {vocab_size} entries")]
    BadId {
        /// The offending id.
        id: u32,
        /// Size of the vocabulary.
        vocab_size: usize,
    },
}
