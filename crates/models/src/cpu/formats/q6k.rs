//! Q6_K: 256 values a super-block, 128 bytes of low nibbles, 64 of high 2-bit pairs, 16
//! signed sub-block scales and an f16 `d`; a value is `d × scale × (q − 32)` of its 16-value
//! sub-block.

use candle_core::quantized::GgmlDType;

use super::{
    chunk_at, dequantize_blocks, le16, pack_decoded, put_nibbles, ActivationKind, DecodedBlock,
    FormatTable,
};

pub(super) static TABLE: FormatTable = FormatTable::new(
    GgmlDType::Q6K,
    (256, 210),
    ActivationKind::Q8Block256,
    dequantize,
    pack_block,
);

fn decode(block: &[u8]) -> DecodedBlock {
    let mut out = DecodedBlock::EMPTY;
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
    out
}

fn dequantize(row: &[u8], out: &mut [f32]) {
    dequantize_blocks(row, out, &TABLE, decode, |b, d, i| {
        d * (b.scales[i / 16] as i8 as f32) * (b.q[i] as f32 - 32.0)
    });
}

/// `d[16]`, `scales[8][16][2]` (signed; sub-blocks `2p`, `2p + 1` side by side), then per
/// 32-value span 4 chunks of low nibbles (as Q4_0) and 2 chunks of high 2-bit pairs (bits
/// `2i..2i+2` of chunk `p` belong to group `4p + i`).
fn pack_block(cols: &[&[u8]], out: &mut [u8]) {
    pack_decoded(cols, out, decode, |cols, out| {
        for (c, b) in cols.iter().enumerate() {
            for j in 0..16 {
                out[32 + 32 * (j / 2) + 2 * c + j % 2] = b.scales[j];
            }
        }
        for span in 0..8 {
            let at = 288 + 384 * span;
            put_nibbles(cols, 32 * span, &mut out[at..at + 256]);
            for p in 0..2 {
                for (c, b) in cols.iter().enumerate() {
                    for t in 0..4 {
                        let mut bits = 0u8;
                        for i in 0..4 {
                            let q = b.q[32 * span + 4 * (4 * p + i) + t];
                            bits |= ((q >> 4) & 3) << (2 * i);
                        }
                        out[at + 256 + 64 * p + chunk_at(c, t)] = bits;
                    }
                }
            }
        }
    });
}
