//! Element types and tensor types (`tensor<fp16, [1, C, 1, 32]>`).

use std::fmt;

/// MIL element type. The set the references use: fp16/fp32 compute, int8 weights, int32
/// parameters, bool flags, string parameters, and uint64 BLOBFILE offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE half precision; all ANE runtime tensors.
    Fp16,
    /// IEEE single precision.
    Fp32,
    /// Signed 8-bit integer (quantized weights).
    Int8,
    /// Signed 32-bit integer (shapes, axes, flags).
    Int32,
    /// Unsigned 64-bit integer (BLOBFILE offsets).
    Uint64,
    /// Boolean flag.
    Bool,
    /// Text (pad types, dtype names, op names).
    String,
}

impl DType {
    /// All element types, in a fixed order (useful for tests and tables).
    pub const ALL: [DType; 7] = [
        DType::Fp16,
        DType::Fp32,
        DType::Int8,
        DType::Int32,
        DType::Uint64,
        DType::Bool,
        DType::String,
    ];

    /// The MIL spelling (`fp16`, `int32`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Fp16 => "fp16",
            DType::Fp32 => "fp32",
            DType::Int8 => "int8",
            DType::Int32 => "int32",
            DType::Uint64 => "uint64",
            DType::Bool => "bool",
            DType::String => "string",
        }
    }

    /// Parse a MIL spelling; `None` for anything else.
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Bytes per element in a dense buffer; `None` for strings.
    pub fn size_bytes(self) -> Option<usize> {
        match self {
            DType::Fp16 => Some(2),
            DType::Fp32 | DType::Int32 => Some(4),
            DType::Int8 | DType::Bool => Some(1),
            DType::Uint64 => Some(8),
            DType::String => None,
        }
    }

    /// True for fp16 / fp32.
    pub fn is_float(self) -> bool {
        matches!(self, DType::Fp16 | DType::Fp32)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A tensor type: element type plus a static shape. Scalars have an empty shape (`[]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first (`[N, C, H, W]` for ANE I/O).
    pub shape: Vec<usize>,
}

impl TensorType {
    /// A tensor type with the given element type and shape.
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> Self {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    /// A rank-0 (scalar) type.
    pub fn scalar(dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: Vec::new(),
        }
    }

    /// An fp16 tensor type; the common case.
    pub fn fp16(shape: impl Into<Vec<usize>>) -> Self {
        TensorType::new(DType::Fp16, shape)
    }

    /// The ANE runtime surface type `[1, channels, 1, lanes]` fp16.
    pub fn surface(channels: usize, lanes: usize) -> Self {
        TensorType::fp16([1, channels, 1, lanes])
    }

    /// True for rank 0.
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }

    /// Rank (number of dimensions).
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (1 for a scalar); `None` on overflow.
    pub fn num_elements(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// Dense size in bytes; `None` for strings or on overflow.
    pub fn size_bytes(&self) -> Option<usize> {
        self.num_elements()?.checked_mul(self.dtype.size_bytes()?)
    }

    /// The same shape with another element type.
    pub fn with_dtype(&self, dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: self.shape.clone(),
        }
    }
}

/// Formats as the `program(1.0)` spelling, `tensor<fp16, [1, 2, 1, 32]>` (scalars `tensor<int32, []>`).
impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tensor<{}, [", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_name("fp64"), None);
    }

    #[test]
    fn display_and_sizes() {
        let t = TensorType::surface(2560, 32);
        assert_eq!(t.to_string(), "tensor<fp16, [1, 2560, 1, 32]>");
        assert_eq!(t.size_bytes(), Some(2560 * 32 * 2));
        assert_eq!(TensorType::scalar(DType::String).to_string(), "tensor<string, []>");
        assert_eq!(TensorType::scalar(DType::Int32).num_elements(), Some(1));
        assert_eq!(TensorType::new(DType::Fp16, [usize::MAX, 2]).num_elements(), None);
    }
}
