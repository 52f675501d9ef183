//! Typed constant values: inline tensor literals and BLOBFILE references.

use half::f16;

use crate::error::BuildError;
use crate::types::{DType, TensorType};

/// The flat, row-major elements of an inline tensor literal. The variant fixes the element type.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// fp16 elements.
    Fp16(Vec<f16>),
    /// fp32 elements.
    Fp32(Vec<f32>),
    /// int8 elements.
    Int8(Vec<i8>),
    /// int32 elements.
    Int32(Vec<i32>),
    /// uint64 elements.
    Uint64(Vec<u64>),
    /// bool elements.
    Bool(Vec<bool>),
    /// string elements.
    String(Vec<String>),
}

impl TensorData {
    /// Element type of the data.
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::Fp16(_) => DType::Fp16,
            TensorData::Fp32(_) => DType::Fp32,
            TensorData::Int8(_) => DType::Int8,
            TensorData::Int32(_) => DType::Int32,
            TensorData::Uint64(_) => DType::Uint64,
            TensorData::Bool(_) => DType::Bool,
            TensorData::String(_) => DType::String,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            TensorData::Fp16(v) => v.len(),
            TensorData::Fp32(v) => v.len(),
            TensorData::Int8(v) => v.len(),
            TensorData::Int32(v) => v.len(),
            TensorData::Uint64(v) => v.len(),
            TensorData::Bool(v) => v.len(),
            TensorData::String(v) => v.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A typed constant as it appears in `val = ...`, in attribute lists and as inline operands.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    /// Inline data: `tensor<int32, [2]>([1, 1])`, `tensor<int32, []>(1)`, `fp16(0x1p-3)`.
    Tensor {
        /// Declared type; a scalar has an empty shape.
        ty: TensorType,
        /// Flat row-major elements (exactly one for a scalar).
        data: TensorData,
    },
    /// Data in a weight file: `tensor<fp16, [O, I, 1, 1]>(BLOBFILE(path = ..., offset = ...(64)))`.
    Blob {
        /// Declared type of the stored tensor.
        ty: TensorType,
        /// File path as the weights dictionary keys it, e.g. `@model_path/weights/w.bin`.
        path: String,
        /// Byte offset of the chunk header inside the file (64 for one-tensor files).
        offset: u64,
    },
}

impl Literal {
    /// A checked inline literal: `data` must match `ty`'s element type and element count.
    pub fn tensor(ty: TensorType, data: TensorData) -> Result<Literal, BuildError> {
        let lit = Literal::Tensor { ty, data };
        lit.validate()?;
        Ok(lit)
    }

    /// A BLOBFILE reference. `offset` is the chunk header offset (64 for one-tensor files).
    pub fn blob(ty: TensorType, path: impl Into<String>, offset: u64) -> Literal {
        Literal::Blob {
            ty,
            path: path.into(),
            offset,
        }
    }

    /// Scalar int32, e.g. `groups`.
    pub fn int32(v: i32) -> Literal {
        Literal::Tensor {
            ty: TensorType::scalar(DType::Int32),
            data: TensorData::Int32(vec![v]),
        }
    }

    /// Rank-1 int32 vector, e.g. strides `[1, 1]`, shapes, axes.
    pub fn int32s(v: &[i32]) -> Literal {
        Literal::Tensor {
            ty: TensorType::new(DType::Int32, [v.len()]),
            data: TensorData::Int32(v.to_vec()),
        }
    }

    /// Scalar bool, e.g. `keep_dims`.
    pub fn bool(v: bool) -> Literal {
        Literal::Tensor {
            ty: TensorType::scalar(DType::Bool),
            data: TensorData::Bool(vec![v]),
        }
    }

    /// Scalar string, e.g. `pad_type = "valid"`.
    pub fn string(v: impl Into<String>) -> Literal {
        Literal::Tensor {
            ty: TensorType::scalar(DType::String),
            data: TensorData::String(vec![v.into()]),
        }
    }

    /// Scalar fp16 (rounded to nearest even from `v`).
    pub fn fp16(v: f32) -> Literal {
        Literal::Tensor {
            ty: TensorType::scalar(DType::Fp16),
            data: TensorData::Fp16(vec![f16::from_f32(v)]),
        }
    }

    /// Scalar fp32.
    pub fn fp32(v: f32) -> Literal {
        Literal::Tensor {
            ty: TensorType::scalar(DType::Fp32),
            data: TensorData::Fp32(vec![v]),
        }
    }

    /// Scalar uint64 (BLOBFILE offsets).
    pub fn uint64(v: u64) -> Literal {
        Literal::Tensor {
            ty: TensorType::scalar(DType::Uint64),
            data: TensorData::Uint64(vec![v]),
        }
    }

    /// The declared type.
    pub fn ty(&self) -> &TensorType {
        match self {
            Literal::Tensor { ty, .. } | Literal::Blob { ty, .. } => ty,
        }
    }

    /// Inline data, if this is not a BLOBFILE reference.
    pub fn data(&self) -> Option<&TensorData> {
        match self {
            Literal::Tensor { data, .. } => Some(data),
            Literal::Blob { .. } => None,
        }
    }

    /// Int32 elements, if this is an inline int32 literal.
    pub fn as_int32s(&self) -> Option<&[i32]> {
        match self.data() {
            Some(TensorData::Int32(v)) => Some(v),
            _ => None,
        }
    }

    /// The single int32 of a scalar or one-element int32 literal.
    pub fn as_int32(&self) -> Option<i32> {
        match self.as_int32s() {
            Some([v]) => Some(*v),
            _ => None,
        }
    }

    /// The single bool of a scalar or one-element bool literal.
    pub fn as_bool(&self) -> Option<bool> {
        match self.data() {
            Some(TensorData::Bool(v)) if v.len() == 1 => v.first().copied(),
            _ => None,
        }
    }

    /// The single string of a scalar or one-element string literal.
    pub fn as_str(&self) -> Option<&str> {
        match self.data() {
            Some(TensorData::String(v)) if v.len() == 1 => v.first().map(String::as_str),
            _ => None,
        }
    }

    /// Check that the data matches the declared type (element type and count).
    pub fn validate(&self) -> Result<(), BuildError> {
        let bad = |ty: &TensorType, message: String| BuildError::BadLiteral {
            ty: ty.to_string(),
            message,
        };
        match self {
            Literal::Tensor { ty, data } => {
                if data.dtype() != ty.dtype {
                    return Err(bad(ty, format!("holds {} elements", data.dtype())));
                }
                let n = ty
                    .num_elements()
                    .ok_or_else(|| bad(ty, "element count overflows".into()))?;
                if data.len() != n {
                    return Err(bad(ty, format!("has {} elements, expected {n}", data.len())));
                }
                Ok(())
            }
            Literal::Blob { ty, .. } => {
                if ty.size_bytes().is_none() {
                    return Err(bad(ty, "a BLOBFILE must hold a fixed-size numeric tensor".into()));
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checked_constructor() {
        assert!(Literal::tensor(TensorType::new(DType::Int32, [2]), TensorData::Int32(vec![1, 1])).is_ok());
        assert!(Literal::tensor(TensorType::new(DType::Int32, [3]), TensorData::Int32(vec![1, 1])).is_err());
        assert!(Literal::tensor(TensorType::scalar(DType::Fp16), TensorData::Int32(vec![1])).is_err());
        assert!(
            Literal::blob(TensorType::scalar(DType::String), "p", 64)
                .validate()
                .is_err()
        );
    }

    #[test]
    fn accessors() {
        assert_eq!(Literal::int32(3).as_int32(), Some(3));
        assert_eq!(Literal::int32s(&[1, 2]).as_int32(), None);
        assert_eq!(Literal::bool(true).as_bool(), Some(true));
        assert_eq!(Literal::string("valid").as_str(), Some("valid"));
    }
}
