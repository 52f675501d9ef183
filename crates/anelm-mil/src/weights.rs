//! The set of weight files handed to the compiler with a program (path → blob bytes).

use std::collections::BTreeMap;

use half::f16;

use crate::blob::{BlobData, read_blob, write_blob};
use crate::builder::BLOB_OFFSET;
use crate::error::BlobError;
use crate::ir::{BlobRef, Program};

/// Weight files keyed by the path the MIL `BLOBFILE` names (`@model_path/weights/<n>.bin`).
/// This is what the real framework receives as its weights dictionary and what the
/// emulator receives instead: bytes, not tensors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WeightFiles {
    files: BTreeMap<String, Vec<u8>>,
}

impl WeightFiles {
    /// No files.
    pub fn new() -> Self {
        WeightFiles::default()
    }

    /// Add (or replace) a file's raw bytes.
    pub fn insert(&mut self, path: impl Into<String>, bytes: Vec<u8>) {
        self.files.insert(path.into(), bytes);
    }

    /// Encode `data` as a one-tensor blob and add it under `path`.
    pub fn insert_tensor(&mut self, path: impl Into<String>, data: &BlobData) -> Result<(), BlobError> {
        self.insert(path, write_blob(data)?);
        Ok(())
    }

    /// Encode fp16 values as a one-tensor blob and add it under `path`.
    pub fn insert_fp16(&mut self, path: impl Into<String>, values: &[f16]) -> Result<(), BlobError> {
        self.insert_tensor(path, &BlobData::Fp16(values.to_vec()))
    }

    /// Encode int8 values as a one-tensor blob and add it under `path`.
    pub fn insert_int8(&mut self, path: impl Into<String>, values: &[i8]) -> Result<(), BlobError> {
        self.insert_tensor(path, &BlobData::Int8(values.to_vec()))
    }

    /// A file's bytes.
    pub fn get(&self, path: &str) -> Option<&[u8]> {
        self.files.get(path).map(Vec::as_slice)
    }

    /// Files in path order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.files.iter().map(|(k, v)| (k.as_str(), v.as_slice()))
    }

    /// Number of files.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// True when there are no files.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Total bytes over all files (headers included).
    pub fn total_bytes(&self) -> usize {
        self.files.values().map(Vec::len).sum()
    }

    /// Resolve one BLOBFILE reference: the file must exist, the offset must be the chunk
    /// header at 64, every header field must be valid, and the payload must hold exactly the
    /// declared tensor.
    pub fn resolve(&self, r: &BlobRef<'_>) -> Result<BlobData, BlobError> {
        let bytes = self
            .get(r.path)
            .ok_or_else(|| BlobError::MissingFile(r.path.to_string()))?;
        if r.offset != BLOB_OFFSET {
            return Err(BlobError::BadOffset(r.offset));
        }
        read_blob(bytes)?.decode(r.ty)
    }

    /// Resolve every BLOBFILE reference of `program`, as (value name, data) in statement order.
    pub fn resolve_program(&self, program: &Program) -> Result<Vec<(String, BlobData)>, BlobError> {
        program
            .blob_refs()
            .iter()
            .map(|r| Ok((r.value.to_string(), self.resolve(r)?)))
            .collect()
    }
}
