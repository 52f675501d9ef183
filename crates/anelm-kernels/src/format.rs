//! `WeightFormat`: the stored tensor formats anelm runs, with llama.cpp's block geometry.

use crate::error::KernelError;

/// A stored tensor format (llama.cpp's ggml type numbering for GGUF).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // llama.cpp's spelling, which users know
pub enum WeightFormat {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 32 × int8 with an f16 scale.
    Q8_0,
    /// 32 × 4-bit (offset 8) with an f16 scale.
    Q4_0,
    /// 32 × 4-bit with f16 scale and minimum.
    Q4_1,
    /// 32 × 5-bit (offset 16) with an f16 scale.
    Q5_0,
    /// 256 × 4-bit in 8 sub-blocks with 6-bit scales and minimums.
    Q4_K,
    /// 256 × 5-bit in 8 sub-blocks with 6-bit scales and minimums.
    Q5_K,
    /// 256 × 6-bit in 16 sub-blocks with int8 scales.
    Q6_K,
    /// 32 × 4-bit indices into ggml's fixed 16-entry non-linear int8 table, with an f16 scale.
    IQ4_NL,
    /// 32 × 5-bit with f16 scale and minimum.
    Q5_1,
    /// 256 × 2-bit in 16 sub-blocks with 4-bit scales and minimums.
    Q2_K,
    /// 256 × 3-bit in 16 sub-blocks with 6-bit signed scales.
    Q3_K,
    /// 256 × 4-bit IQ4_NL indices in 8 sub-blocks with 6-bit signed scales.
    IQ4_XS,
    /// 32 × FP4 (E2M1) values with a shared power-of-two (E8M0) scale: the OCP microscaling
    /// format of gpt-oss and of llama.cpp's `MXFP4_MOE` files.
    MXFP4,
}

impl WeightFormat {
    /// All formats.
    pub const ALL: [WeightFormat; 16] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q8_0,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::IQ4_NL,
        Self::Q5_1,
        Self::Q2_K,
        Self::Q3_K,
        Self::IQ4_XS,
        Self::MXFP4,
    ];

    /// From a ggml type id; `None` for types anelm does not run.
    pub fn from_ggml_type(t: u32) -> Option<Self> {
        Some(match t {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            10 => Self::Q2_K,
            11 => Self::Q3_K,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            20 => Self::IQ4_NL,
            23 => Self::IQ4_XS,
            30 => Self::BF16,
            39 => Self::MXFP4,
            _ => return None,
        })
    }

    /// The ggml type id.
    pub fn ggml_type(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::IQ4_NL => 20,
            Self::IQ4_XS => 23,
            Self::BF16 => 30,
            Self::MXFP4 => 39,
        }
    }

    /// Whether matrices in `self` and `other` take the same quantised activations, so one
    /// [`crate::Activations::quantize`] serves both (and a fused loop can hold both): the same
    /// format, or two K-quants (Q8_K blocks, which carry the sums every K-quant kernel needs).
    pub fn shares_activations(self, other: WeightFormat) -> bool {
        let k_quant = |f: WeightFormat| f.block_elems() == 256;
        self == other || (k_quant(self) && k_quant(other))
    }

    /// Name as llama.cpp spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q8_0 => "Q8_0",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::IQ4_NL => "IQ4_NL",
            Self::Q5_1 => "Q5_1",
            Self::Q2_K => "Q2_K",
            Self::Q3_K => "Q3_K",
            Self::IQ4_XS => "IQ4_XS",
            Self::MXFP4 => "MXFP4",
        }
    }

    /// Elements per block (1 for the float formats).
    pub fn block_elems(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q8_0 | Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::IQ4_NL | Self::MXFP4 => 32,
            Self::Q4_K | Self::Q5_K | Self::Q6_K | Self::Q2_K | Self::Q3_K | Self::IQ4_XS => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q8_0 => 34,
            Self::Q4_0 | Self::IQ4_NL => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q4_K => 144,
            Self::Q5_K => 176,
            Self::Q6_K => 210,
            Self::Q5_1 => 24,
            Self::Q2_K => 84,
            Self::Q3_K => 110,
            Self::IQ4_XS => 136,
            Self::MXFP4 => 17,
        }
    }

    /// Whether this is a block-quantised format.
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes of one row of `cols` elements.
    pub fn row_bytes(self, cols: usize) -> Result<usize, KernelError> {
        let be = self.block_elems();
        if !cols.is_multiple_of(be) {
            return Err(KernelError::PartialBlock {
                format: self.name(),
                elems: cols,
                block: be,
            });
        }
        (cols / be).checked_mul(self.block_bytes()).ok_or(KernelError::Overflow)
    }

    /// Bytes of a tensor of `elems` elements; `None` on overflow or a partial block.
    pub fn tensor_bytes(self, elems: u64) -> Option<u64> {
        let be = self.block_elems() as u64;
        if !elems.is_multiple_of(be) {
            return None;
        }
        (elems / be).checked_mul(self.block_bytes() as u64)
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
