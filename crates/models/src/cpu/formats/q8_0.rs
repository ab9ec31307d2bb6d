//! Q8_0: 32 values a block, an f16 scale `d` and 32 signed bytes; a value is `d × q`.

use candle_core::quantized::GgmlDType;

use super::{
    chunk_at, dequantize_blocks, le16, pack_decoded, ActivationKind, DecodedBlock, FormatTable,
};

pub(super) static TABLE: FormatTable = FormatTable::new(
    GgmlDType::Q8_0,
    (32, 34),
    ActivationKind::Q8Block32,
    dequantize,
    pack_block,
);

fn decode(block: &[u8]) -> DecodedBlock {
    let mut out = DecodedBlock::EMPTY;
    out.d = le16(block, 0);
    out.q[..32].copy_from_slice(&block[2..34]);
    out
}

fn dequantize(row: &[u8], out: &mut [f32]) {
    dequantize_blocks(row, out, &TABLE, decode, |b, d, i| {
        d * (b.q[i] as i8 as f32)
    });
}

/// `d[16]`, then 8 chunks of 4 signed values.
fn pack_block(cols: &[&[u8]], out: &mut [u8]) {
    pack_decoded(cols, out, decode, |cols, out| {
        for g in 0..8 {
            for (c, b) in cols.iter().enumerate() {
                for t in 0..4 {
                    out[32 + 64 * g + chunk_at(c, t)] = b.q[4 * g + t];
                }
            }
        }
    });
}
