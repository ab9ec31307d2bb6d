//! The GGUF weight formats the CPU engine runs natively; what each one is (its block
//! layout, how it dequantizes and packs) is its table in `formats/`.

use candle_core::quantized::GgmlDType;

use super::formats::FormatTable;

/// A matmul weight's storage format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    F32,
    F16,
    BF16,
    Q4_0,
    Q5_0,
    Q8_0,
    Q4K,
    Q6K,
}

/// How a layer input must be prepared for a format's kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActivationKind {
    /// f32 as is (dense weights).
    Dense,
    /// int8 with one scale per 32 values (Q4_0, Q5_0, Q8_0).
    Q8Block32,
    /// int8 with one scale per 256 values (the K-quants).
    Q8Block256,
}

impl ActivationKind {
    pub fn block(self) -> usize {
        match self {
            Self::Dense => 1,
            Self::Q8Block32 => 32,
            Self::Q8Block256 => 256,
        }
    }
}

impl WeightFormat {
    /// The native format for a GGUF type, if there is one.
    pub fn from_ggml(dtype: GgmlDType) -> Option<Self> {
        Some(match dtype {
            GgmlDType::F32 => Self::F32,
            GgmlDType::F16 => Self::F16,
            GgmlDType::BF16 => Self::BF16,
            GgmlDType::Q4_0 => Self::Q4_0,
            GgmlDType::Q5_0 => Self::Q5_0,
            GgmlDType::Q8_0 => Self::Q8_0,
            GgmlDType::Q4K => Self::Q4K,
            GgmlDType::Q6K => Self::Q6K,
            _ => return None,
        })
    }

    /// The format's table: sizes, activation, dequantizer and tile packer.
    pub(crate) fn table(self) -> &'static FormatTable {
        super::formats::table(self)
    }

    pub fn ggml(self) -> GgmlDType {
        self.table().ggml
    }

    /// Values per GGUF block.
    pub fn block_len(self) -> usize {
        self.table().block_len
    }

    /// Bytes per GGUF block.
    pub fn block_bytes(self) -> usize {
        self.table().block_bytes
    }

    /// Bytes of one block of 16 interleaved columns in the packed layout (see `pack`).
    pub fn tile_block_bytes(self) -> usize {
        self.table().tile_block_bytes
    }

    pub fn activation(self) -> ActivationKind {
        self.table().activation
    }

    /// Bytes of a row of `len` values, if `len` is a whole number of blocks.
    pub fn row_bytes(self, len: usize) -> Option<usize> {
        len.is_multiple_of(self.block_len())
            .then(|| len / self.block_len() * self.block_bytes())
    }
}

/// Decodes a GGUF row of `out.len()` values into f32 (token embedding lookup, tests).
pub fn dequantize_row(format: WeightFormat, row: &[u8], out: &mut [f32]) {
    (format.table().dequantize)(row, out)
}
