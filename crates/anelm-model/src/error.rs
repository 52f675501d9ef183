//! Errors from reading model files (GGUF, safetensors directories, `config.json`).

use std::path::PathBuf;

/// Everything that can go wrong reading a model file; messages name the
/// file/key/tensor and say what to do.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file or directory could not be opened, read or mapped.
    #[error("cannot read {}: {source}; check that the path exists and is readable", path.display())]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// The underlying OS error.
        source: std::io::Error,
    },

    /// A binary file is truncated or corrupt at a known byte position.
    #[error(
        "malformed {file} at byte {offset}: {what}; the file is truncated or corrupt, re-download or re-convert it"
    )]
    Malformed {
        /// The file (path, or a description for in-memory data).
        file: String,
        /// Byte offset in the file where the problem was found.
        offset: u64,
        /// What is wrong.
        what: String,
    },

    /// A file is structurally invalid in a way that has no single byte position
    /// (an inconsistent index, a bad config value, a corrupt safetensors header).
    #[error("invalid {file}: {what}")]
    Invalid {
        /// The file (path, or a description for in-memory data).
        file: String,
        /// What is wrong and, where possible, how to fix it.
        what: String,
    },

    /// A GGUF file of a version this reader does not handle.
    #[error(
        "{file} is GGUF version {version}, but only versions 2 and 3 are supported; re-convert the model with a current llama.cpp `convert_hf_to_gguf.py`"
    )]
    UnsupportedVersion {
        /// The file.
        file: String,
        /// The version number found in the header.
        version: u32,
    },

    /// A JSON file (config, safetensors index) could not be parsed.
    #[error("cannot parse {} as JSON: {source}; the file is corrupt or not the expected kind", path.display())]
    Json {
        /// The JSON file.
        path: PathBuf,
        /// The parser error (with line and column).
        source: serde_json::Error,
    },

    /// The model has no tensor of this name.
    #[error("tensor `{name}` is not in the model; the checkpoint is incomplete or for a different architecture")]
    MissingTensor {
        /// The requested tensor name.
        name: String,
    },

    /// A required metadata / config key is absent.
    #[error(
        "required key `{key}` is missing from the model metadata; the file is incomplete or for a different architecture"
    )]
    MissingKey {
        /// The key.
        key: String,
    },

    /// A metadata / config key is present but has an unusable value.
    #[error("key `{key}` has an unusable value: {what}")]
    BadValue {
        /// The key.
        key: String,
        /// What is wrong with the value.
        what: String,
    },

    /// A tensor is stored in a format anelm cannot compute with.
    #[error(
        "tensor `{tensor}` is stored as {format}, which anelm cannot run; use a model stored as F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS or MXFP4"
    )]
    UnsupportedFormat {
        /// The tensor name.
        tensor: String,
        /// The stored format (ggml type name/id or safetensors dtype).
        format: String,
    },
}
