//! The weight blob ("BLOBFILE") container, one tensor per file.
//!
//! Byte layout (all little-endian, every unlisted byte zero; `ane-runtime.md` §4):
//!
//! | offset | size | value |
//! |---|---|---|
//! | 0   | u32 | 1 (file header) |
//! | 4   | u32 | 2 (file header) |
//! | 64  | u32 | magic `0xDEADBEEF` (bytes `EF BE AD DE`; chunk header) |
//! | 68  | u32 | 1 |
//! | 72  | u32 | payload size in bytes (fp16: n·2; int8: n, unpadded) |
//! | 80  | u32 | absolute payload offset = 128 |
//! | 128 | …   | payload, row-major in the MIL-declared shape; padded with one zero byte to an even length |
//!
//! MIL refers to the tensor at the chunk header: `BLOBFILE(path = …, offset = …(64))`.
//! This is the only layout that works on every chip (M1 included), so it is the only one
//! written and the only one read.

use half::f16;

use crate::error::BlobError;
use crate::types::{DType, TensorType};

/// Length of the file header.
pub const FILE_HEADER_LEN: usize = 64;
/// Length of the chunk header.
pub const CHUNK_HEADER_LEN: usize = 64;
/// Absolute offset of the payload.
pub const DATA_OFFSET: usize = FILE_HEADER_LEN + CHUNK_HEADER_LEN;
/// Chunk header magic.
pub const BLOB_MAGIC: u32 = 0xDEAD_BEEF;

/// Non-zero u32 fields, as (name, absolute offset, value).
const FIELDS: [(&str, usize, u32); 4] = [
    ("file header word 0", 0, 1),
    ("file header word 1", 4, 2),
    ("chunk magic", 64, BLOB_MAGIC),
    ("chunk header word 1", 68, 1),
];
const SIZE_AT: usize = 72;
const OFFSET_AT: usize = 80;

/// A decoded blob payload. The container does not record the element type; it comes from
/// the MIL declaration of the const that references the file.
#[derive(Debug, Clone, PartialEq)]
pub enum BlobData {
    /// fp16 elements (weights, scales).
    Fp16(Vec<f16>),
    /// int8 elements (quantized weights).
    Int8(Vec<i8>),
}

impl BlobData {
    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            BlobData::Fp16(_) => DType::Fp16,
            BlobData::Int8(_) => DType::Int8,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            BlobData::Fp16(v) => v.len(),
            BlobData::Int8(v) => v.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn payload(&self) -> Vec<u8> {
        match self {
            BlobData::Fp16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            BlobData::Int8(v) => v.iter().map(|x| x.to_le_bytes()[0]).collect(),
        }
    }
}

/// Encode one tensor as a complete weight file.
pub fn write_blob(data: &BlobData) -> Result<Vec<u8>, BlobError> {
    let payload = data.payload();
    let size = u32::try_from(payload.len()).map_err(|_| BlobError::PayloadTooLarge(payload.len()))?;
    let padded = payload.len() + payload.len() % 2;
    let mut out = vec![0u8; DATA_OFFSET + padded];
    for (_, at, v) in FIELDS {
        out[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    out[SIZE_AT..SIZE_AT + 4].copy_from_slice(&size.to_le_bytes());
    out[OFFSET_AT..OFFSET_AT + 4].copy_from_slice(&(DATA_OFFSET as u32).to_le_bytes());
    out[DATA_OFFSET..DATA_OFFSET + payload.len()].copy_from_slice(&payload);
    Ok(out)
}

/// Encode an fp16 tensor (row-major) as a weight file.
pub fn write_fp16_blob(values: &[f16]) -> Result<Vec<u8>, BlobError> {
    write_blob(&BlobData::Fp16(values.to_vec()))
}

/// Encode an int8 tensor (row-major) as a weight file.
pub fn write_int8_blob(values: &[i8]) -> Result<Vec<u8>, BlobError> {
    write_blob(&BlobData::Int8(values.to_vec()))
}

/// A weight file whose headers have been validated; the payload is borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightBlob<'a> {
    /// Payload bytes (exactly the declared size; padding excluded).
    pub payload: &'a [u8],
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        w.copy_from_slice(s);
    }
    u32::from_le_bytes(w)
}

/// Validate every header field of a one-tensor weight file and return its payload.
///
/// Checks: length ≥ 128; file header words 1 and 2; magic `0xDEADBEEF`; chunk word 1;
/// payload offset 128; every reserved byte zero; file length = 128 + size rounded up to
/// even, with a zero pad byte.
pub fn read_blob(bytes: &[u8]) -> Result<WeightBlob<'_>, BlobError> {
    if bytes.len() < DATA_OFFSET {
        return Err(BlobError::TooShort { len: bytes.len() });
    }
    for (field, at, expected) in FIELDS {
        let found = u32_at(bytes, at);
        if found != expected {
            return Err(BlobError::BadField {
                field,
                offset: at,
                found: found.into(),
                expected: expected.into(),
            });
        }
    }
    let offset = u32_at(bytes, OFFSET_AT);
    if offset as usize != DATA_OFFSET {
        return Err(BlobError::BadField {
            field: "chunk payload offset",
            offset: OFFSET_AT,
            found: offset.into(),
            expected: DATA_OFFSET as u64,
        });
    }
    let field_bytes = |at: usize| at..at + 4;
    let non_zero = FIELDS
        .iter()
        .map(|f| f.1)
        .chain([SIZE_AT, OFFSET_AT])
        .flat_map(field_bytes)
        .collect::<Vec<_>>();
    for (i, &b) in bytes.iter().enumerate().take(DATA_OFFSET) {
        if b != 0 && !non_zero.contains(&i) {
            return Err(BlobError::NonZeroReserved { offset: i, found: b });
        }
    }
    let size = u32_at(bytes, SIZE_AT) as usize;
    let available = bytes.len() - DATA_OFFSET;
    let padded = size.checked_add(size % 2);
    if padded != Some(available) {
        return Err(BlobError::SizeMismatch {
            declared: size as u64,
            available,
        });
    }
    if size % 2 == 1 && bytes.last() != Some(&0) {
        return Err(BlobError::NonZeroReserved {
            offset: bytes.len() - 1,
            found: bytes.last().copied().unwrap_or(0),
        });
    }
    Ok(WeightBlob {
        payload: &bytes[DATA_OFFSET..DATA_OFFSET + size],
    })
}

impl WeightBlob<'_> {
    /// Decode the payload as the tensor `ty` (fp16 or int8); the payload must hold exactly
    /// ∏shape elements.
    pub fn decode(&self, ty: &TensorType) -> Result<BlobData, BlobError> {
        let elem = match ty.dtype {
            DType::Fp16 => 2u64,
            DType::Int8 => 1,
            other => return Err(BlobError::UnsupportedDType(other.to_string())),
        };
        let expected = ty.num_elements().and_then(|n| (n as u64).checked_mul(elem));
        let found = self.payload.len() as u64;
        if expected != Some(found) {
            return Err(BlobError::PayloadMismatch {
                found,
                expected: expected.unwrap_or(u64::MAX),
                tensor: ty.to_string(),
            });
        }
        Ok(match ty.dtype {
            DType::Fp16 => BlobData::Fp16(
                self.payload
                    .chunks_exact(2)
                    .map(|c| f16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
            _ => BlobData::Int8(self.payload.iter().map(|&b| i8::from_le_bytes([b])).collect()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_reference_table() {
        // ane-runtime.md §4 / ane-hardware.md §2.1, a 2×2 fp16 weight (8 payload bytes).
        let vals = [1.0f32, -2.0, 0.5, 65504.0].map(f16::from_f32);
        let b = write_fp16_blob(&vals).unwrap();
        assert_eq!(b.len(), 128 + 8);
        let mut expected = vec![0u8; 136];
        expected[0] = 0x01;
        expected[4] = 0x02;
        expected[64..68].copy_from_slice(&[0xEF, 0xBE, 0xAD, 0xDE]);
        expected[68] = 0x01;
        expected[72] = 8;
        expected[80] = 128;
        expected[128..].copy_from_slice(&[0x00, 0x3C, 0x00, 0xC0, 0x00, 0x38, 0xFF, 0x7B]);
        assert_eq!(b, expected);
        let r = read_blob(&b).unwrap();
        assert_eq!(
            r.decode(&TensorType::fp16([2, 2, 1, 1])).unwrap(),
            BlobData::Fp16(vals.to_vec())
        );
    }

    #[test]
    fn int8_is_padded_to_even_length_with_unpadded_size() {
        let b = write_int8_blob(&[1, -1, 127]).unwrap();
        assert_eq!(b.len(), 128 + 4);
        assert_eq!(u32_at(&b, SIZE_AT), 3);
        assert_eq!(&b[128..], &[1, 0xFF, 127, 0]);
        let r = read_blob(&b).unwrap();
        assert_eq!(r.payload.len(), 3);
        assert_eq!(
            r.decode(&TensorType::new(DType::Int8, [3, 1, 1, 1])).unwrap(),
            BlobData::Int8(vec![1, -1, 127])
        );
        assert!(r.decode(&TensorType::new(DType::Int8, [4, 1, 1, 1])).is_err());
        assert!(r.decode(&TensorType::new(DType::Fp32, [3])).is_err());
    }
}
