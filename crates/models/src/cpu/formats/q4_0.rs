//! Q4_0: 32 values a block, an f16 scale `d` and 16 bytes of nibbles (values `j` and
//! `j + 16` in byte `j`); a value is `d × (q − 8)`.

use candle_core::quantized::GgmlDType;

use super::{
    dequantize_blocks, le16, pack_decoded, put_nibbles, split_nibbles, ActivationKind,
    DecodedBlock, FormatTable,
};

pub(super) static TABLE: FormatTable = FormatTable::new(
    GgmlDType::Q4_0,
    (32, 18),
    ActivationKind::Q8Block32,
    dequantize,
    pack_block,
);

fn decode(block: &[u8]) -> DecodedBlock {
    let mut out = DecodedBlock::EMPTY;
    out.d = le16(block, 0);
    split_nibbles(&block[2..18], &mut out.q);
    out
}

fn dequantize(row: &[u8], out: &mut [f32]) {
    dequantize_blocks(row, out, &TABLE, decode, |b, d, i| {
        d * (b.q[i] as f32 - 8.0)
    });
}

/// `d[16]`, then 4 chunks of nibbles.
fn pack_block(cols: &[&[u8]], out: &mut [u8]) {
    pack_decoded(cols, out, decode, |cols, out| {
        put_nibbles(cols, 0, &mut out[32..288])
    });
}
