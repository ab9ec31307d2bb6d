//! The GGUF weight formats the CPU engine runs natively: how a row is stored in the file
//! (ggml's block layouts) and how one block decodes to its integer codes and scales.

use candle_core::quantized::GgmlDType;
use half::{bf16, f16};

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

    pub fn ggml(self) -> GgmlDType {
        match self {
            Self::F32 => GgmlDType::F32,
            Self::F16 => GgmlDType::F16,
            Self::BF16 => GgmlDType::BF16,
            Self::Q4_0 => GgmlDType::Q4_0,
            Self::Q5_0 => GgmlDType::Q5_0,
            Self::Q8_0 => GgmlDType::Q8_0,
            Self::Q4K => GgmlDType::Q4K,
            Self::Q6K => GgmlDType::Q6K,
        }
    }

    /// Values per GGUF block.
    pub fn block_len(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q5_0 | Self::Q8_0 => 32,
            Self::Q4K | Self::Q6K => 256,
        }
    }

    /// Bytes per GGUF block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q5_0 => 22,
            Self::Q8_0 => 34,
            Self::Q4K => 144,
            Self::Q6K => 210,
        }
    }

    /// Bytes of one block of 16 interleaved columns in the packed layout (see `pack`).
    pub fn tile_block_bytes(self) -> usize {
        match self {
            // Q4_K keeps its 6-bit scales and mins as whole bytes: 148 bytes per column
            // block instead of 144.
            Self::Q4K => 2368,
            other => 16 * other.block_bytes(),
        }
    }

    pub fn activation(self) -> ActivationKind {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => ActivationKind::Dense,
            Self::Q4_0 | Self::Q5_0 | Self::Q8_0 => ActivationKind::Q8Block32,
            Self::Q4K | Self::Q6K => ActivationKind::Q8Block256,
        }
    }

    /// Bytes of a row of `len` values, if `len` is a whole number of blocks.
    pub fn row_bytes(self, len: usize) -> Option<usize> {
        len.is_multiple_of(self.block_len())
            .then(|| len / self.block_len() * self.block_bytes())
    }
}

/// One GGUF block decoded to its integer codes (natural value order) and scales.
pub(crate) struct DecodedBlock {
    /// `q[i]`: the unsigned code of value `i` (K-quants, Q4_0, Q5_0) or the signed code as
    /// a byte (Q8_0).
    pub q: [u8; 256],
    pub d: u16,
    /// Q4_K: the super-block min scale.
    pub dmin: u16,
    /// Q4_K: 8 sub-block scales; Q6_K: 16 signed sub-block scales (as bytes).
    pub scales: [u8; 16],
    /// Q4_K: 8 sub-block mins.
    pub mins: [u8; 8],
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

impl DecodedBlock {
    fn empty() -> Self {
        Self {
            q: [0; 256],
            d: 0,
            dmin: 0,
            scales: [0; 16],
            mins: [0; 8],
        }
    }

    /// Decodes one quantized block (`block.len() == format.block_bytes()`).
    pub fn decode(format: WeightFormat, block: &[u8]) -> Self {
        let mut out = Self::empty();
        match format {
            WeightFormat::Q4_0 => {
                out.d = le16(block, 0);
                for j in 0..16 {
                    out.q[j] = block[2 + j] & 0x0f;
                    out.q[j + 16] = block[2 + j] >> 4;
                }
            }
            WeightFormat::Q5_0 => {
                out.d = le16(block, 0);
                let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
                for j in 0..16 {
                    let hi = |k: usize| (((qh >> k) & 1) << 4) as u8;
                    out.q[j] = (block[6 + j] & 0x0f) | hi(j);
                    out.q[j + 16] = (block[6 + j] >> 4) | hi(j + 16);
                }
            }
            WeightFormat::Q8_0 => {
                out.d = le16(block, 0);
                out.q[..32].copy_from_slice(&block[2..34]);
            }
            WeightFormat::Q4K => {
                out.d = le16(block, 0);
                out.dmin = le16(block, 2);
                let s = &block[4..16];
                for j in 0..8 {
                    let (sc, m) = if j < 4 {
                        (s[j] & 63, s[j + 4] & 63)
                    } else {
                        (
                            (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
                            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
                        )
                    };
                    out.scales[j] = sc;
                    out.mins[j] = m;
                }
                let qs = &block[16..144];
                for chunk in 0..4 {
                    for l in 0..32 {
                        out.q[64 * chunk + l] = qs[32 * chunk + l] & 0x0f;
                        out.q[64 * chunk + 32 + l] = qs[32 * chunk + l] >> 4;
                    }
                }
            }
            WeightFormat::Q6K => {
                let (ql, qh, sc) = (&block[..128], &block[128..192], &block[192..208]);
                out.d = le16(block, 208);
                out.scales.copy_from_slice(sc);
                for half in 0..2 {
                    let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
                    let base = 128 * half;
                    for l in 0..32 {
                        out.q[base + l] = (ql[l] & 0x0f) | ((qh[l] & 3) << 4);
                        out.q[base + l + 32] = (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4);
                        out.q[base + l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                        out.q[base + l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                    }
                }
            }
            WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => {}
        }
        out
    }
}

/// Decodes a GGUF row of `out.len()` values into f32 (token embedding lookup, tests).
pub fn dequantize_row(format: WeightFormat, row: &[u8], out: &mut [f32]) {
    let bytes = format.block_bytes();
    match format {
        WeightFormat::F32 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        WeightFormat::F16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        WeightFormat::BF16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        _ => {
            let len = format.block_len();
            for (o, block) in out.chunks_mut(len).zip(row.chunks_exact(bytes)) {
                let b = DecodedBlock::decode(format, block);
                let d = f16::from_bits(b.d).to_f32();
                for (i, v) in o.iter_mut().enumerate() {
                    let q = b.q[i];
                    *v = match format {
                        WeightFormat::Q4_0 => d * (q as f32 - 8.0),
                        WeightFormat::Q5_0 => d * (q as f32 - 16.0),
                        WeightFormat::Q8_0 => d * (q as i8 as f32),
                        WeightFormat::Q4K => {
                            let dmin = f16::from_bits(b.dmin).to_f32();
                            let j = i / 32;
                            d * b.scales[j] as f32 * q as f32 - dmin * b.mins[j] as f32
                        }
                        WeightFormat::Q6K => {
                            d * (b.scales[i / 16] as i8 as f32) * (q as f32 - 32.0)
                        }
                        _ => unreachable!("dense formats are handled above"),
                    };
                }
            }
        }
    }
}
