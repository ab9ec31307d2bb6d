//! F32, F16 and BF16: one value a block, packed as the 16 columns' values side by side per
//! reduction index, and read by the kernels as f32 rows.

use candle_core::quantized::GgmlDType;
use half::{bf16, f16};

use super::{ActivationKind, FormatTable};

pub(super) static F32: FormatTable = dense(GgmlDType::F32, 4, dequantize_f32);
pub(super) static F16: FormatTable = dense(GgmlDType::F16, 2, dequantize_f16);
pub(super) static BF16: FormatTable = dense(GgmlDType::BF16, 2, dequantize_bf16);

const fn dense(ggml: GgmlDType, bytes: usize, dequantize: fn(&[u8], &mut [f32])) -> FormatTable {
    FormatTable::new(
        ggml,
        (1, bytes),
        ActivationKind::Dense,
        dequantize,
        pack_block,
    )
}

fn dequantize_f32(row: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

fn dequantize_f16(row: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
        *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

fn dequantize_bf16(row: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
        *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

/// The columns' values side by side, as stored.
fn pack_block(cols: &[&[u8]], out: &mut [u8]) {
    for (c, col) in cols.iter().enumerate() {
        out[c * col.len()..(c + 1) * col.len()].copy_from_slice(col);
    }
}
