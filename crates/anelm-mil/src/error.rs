//! Error types: one per stage (parsing text, reading blobs, building/checking programs).

use thiserror::Error;

/// MIL text could not be parsed. Carries the 1-based line and column of the offending token.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("MIL parse error at line {line}, column {column}: {message}")]
pub struct ParseError {
    /// 1-based line of the offending character or token.
    pub line: usize,
    /// 1-based column (in characters) of the offending character or token.
    pub column: usize,
    /// What was wrong, and usually what was expected instead.
    pub message: String,
}

/// A weight blob (BLOBFILE container) is malformed or does not match what the program declares.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BlobError {
    /// The byte slice is shorter than the two 64-byte headers.
    #[error("weight blob is {len} bytes, shorter than the 128-byte file + chunk header")]
    TooShort {
        /// Actual length in bytes.
        len: usize,
    },
    /// A fixed header field holds the wrong value.
    #[error("weight blob header field `{field}` at byte {offset} is {found:#x}, expected {expected:#x}")]
    BadField {
        /// Field name as the reference format table names it.
        field: &'static str,
        /// Absolute byte offset of the field.
        offset: usize,
        /// Value found.
        found: u64,
        /// Value required.
        expected: u64,
    },
    /// A header byte that must be zero is not.
    #[error("weight blob reserved byte {offset} is {found:#04x}, expected 0")]
    NonZeroReserved {
        /// Absolute byte offset.
        offset: usize,
        /// Value found.
        found: u8,
    },
    /// The payload size field disagrees with the file length.
    #[error("weight blob declares a {declared}-byte payload but the file holds {available} bytes after the headers")]
    SizeMismatch {
        /// Size from the chunk header.
        declared: u64,
        /// Bytes actually present after byte 128.
        available: usize,
    },
    /// The payload length is not what the declared tensor needs.
    #[error("weight blob payload is {found} bytes, but tensor {tensor} needs {expected} bytes")]
    PayloadMismatch {
        /// Payload bytes found.
        found: u64,
        /// Bytes the declared tensor type needs.
        expected: u64,
        /// The declared tensor type, as MIL text.
        tensor: String,
    },
    /// The blob's element type is not one the container carries.
    #[error("weight blobs carry fp16 or int8 payloads, not {0}")]
    UnsupportedDType(String),
    /// A BLOBFILE reference names a file that was not provided.
    #[error("BLOBFILE path {0:?} is not among the provided weight files")]
    MissingFile(String),
    /// A BLOBFILE reference uses an offset other than the chunk header at 64.
    #[error("BLOBFILE offset {0} is not supported: one tensor per file, chunk header at offset 64")]
    BadOffset(u64),
    /// The payload is too large for the container's 32-bit size field.
    #[error("payload of {0} bytes does not fit the 32-bit size field")]
    PayloadTooLarge(usize),
}

/// A program could not be built or failed a structural / type check.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BuildError {
    /// A name is not a valid MIL identifier (`[A-Za-z_][A-Za-z0-9_]*`).
    #[error("{0:?} is not a valid MIL identifier")]
    BadIdentifier(String),
    /// A value name is defined twice in one function.
    #[error("value `{0}` is defined more than once")]
    Redefined(String),
    /// An op `name` attribute is used twice in one function.
    #[error("op name {0:?} is used more than once")]
    DuplicateOpName(String),
    /// A statement has no `name` attribute.
    #[error("statement defining `{0}` has no name attribute")]
    MissingName(String),
    /// A value is used before (or without) being defined.
    #[error("value `{0}` is used but not defined")]
    Undefined(String),
    /// An op's operands have types it does not accept.
    #[error("{op} `{value}`: {message}")]
    Type {
        /// Op name.
        op: String,
        /// Name of the value being defined.
        value: String,
        /// What is wrong.
        message: String,
    },
    /// The declared result type differs from the inferred one.
    #[error("{op} `{value}` is declared {declared} but its operands give {inferred}")]
    DeclaredTypeMismatch {
        /// Op name.
        op: String,
        /// Name of the value being defined.
        value: String,
        /// Type written in the statement.
        declared: String,
        /// Type the operands produce.
        inferred: String,
    },
    /// A literal's data does not match its declared type.
    #[error("literal of type {ty}: {message}")]
    BadLiteral {
        /// Declared type, as MIL text.
        ty: String,
        /// What is wrong.
        message: String,
    },
    /// The program's `buildInfo` has no `coremlc-version` entry (the MIL parser requires one).
    #[error("buildInfo has no \"coremlc-version\" entry; the ANE MIL parser requires it")]
    MissingBuildInfo,
    /// A function output names no defined value.
    #[error("function output `{0}` is not defined")]
    UndefinedOutput(String),
    /// An op needs a newer opset than the function declares.
    #[error("{op} needs opset {needs} or newer, but the function targets {declared}")]
    OpsetTooOld {
        /// Op name.
        op: String,
        /// Minimum opset.
        needs: String,
        /// Opset of the function.
        declared: String,
    },
}
