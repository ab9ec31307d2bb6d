//! Q5_0: 32 values a block, an f16 scale `d`, 32 fifth bits and Q4_0's nibbles; a value is
//! `d × (q − 16)`.

use candle_core::quantized::GgmlDType;

use super::{
    chunk_at, dequantize_blocks, le16, pack_decoded, put_nibbles, split_nibbles, ActivationKind,
    DecodedBlock, FormatTable,
};

pub(super) static TABLE: FormatTable = FormatTable::new(
    GgmlDType::Q5_0,
    (32, 22),
    ActivationKind::Q8Block32,
    dequantize,
    pack_block,
);

fn decode(block: &[u8]) -> DecodedBlock {
    let mut out = DecodedBlock::EMPTY;
    out.d = le16(block, 0);
    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    split_nibbles(&block[6..22], &mut out.q);
    for (k, q) in out.q[..32].iter_mut().enumerate() {
        *q |= (((qh >> k) & 1) << 4) as u8;
    }
    out
}

fn dequantize(row: &[u8], out: &mut [f32]) {
    dequantize_blocks(row, out, &TABLE, decode, |b, d, i| {
        d * (b.q[i] as f32 - 16.0)
    });
}

/// As Q4_0, then 64 bytes whose bit `g` of byte `4c + t` is the fifth bit of value `4g + t`
/// of column `c`.
fn pack_block(cols: &[&[u8]], out: &mut [u8]) {
    pack_decoded(cols, out, decode, |cols, out| {
        put_nibbles(cols, 0, &mut out[32..288]);
        for (c, b) in cols.iter().enumerate() {
            for t in 0..4 {
                let mut bits = 0u8;
                for g in 0..8 {
                    bits |= ((b.q[4 * g + t] >> 4) & 1) << g;
                }
                out[288 + chunk_at(c, t)] = bits;
            }
        }
    });
}
