//! Q4_K: 256 values a super-block, f16 `d` and `dmin`, 8 six-bit sub-block scales and mins
//! and 128 bytes of nibbles; a value is `d × scale × q − dmin × min` of its 32-value
//! sub-block.

use candle_core::quantized::GgmlDType;
use half::f16;

use super::{
    dequantize_blocks, le16, pack_decoded, put_d, put_nibbles, split_nibbles, ActivationKind,
    DecodedBlock, FormatTable,
};

// The 6-bit scales and mins are kept as whole bytes: 148 bytes per column block
// instead of 144.
pub(super) static TABLE: FormatTable = FormatTable::new(
    GgmlDType::Q4K,
    (256, 144),
    ActivationKind::Q8Block256,
    dequantize,
    pack_block,
)
.with_tile_block_bytes(2368);

fn decode(block: &[u8]) -> DecodedBlock {
    let mut out = DecodedBlock::EMPTY;
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
    for (bytes, q) in block[16..144]
        .chunks_exact(32)
        .zip(out.q.chunks_exact_mut(64))
    {
        split_nibbles(bytes, q);
    }
    out
}

fn dequantize(row: &[u8], out: &mut [f32]) {
    dequantize_blocks(row, out, &TABLE, decode, |b, d, i| {
        let dmin = f16::from_bits(b.dmin).to_f32();
        let j = i / 32;
        d * b.scales[j] as f32 * b.q[i] as f32 - dmin * b.mins[j] as f32
    });
}

/// `d[16]`, `dmin[16]`, `scales[8][16]`, `mins[4][16][2]` (sub-blocks `2q`, `2q + 1` side
/// by side), then per 32-value sub-block Q4_0's 4 nibble chunks.
fn pack_block(cols: &[&[u8]], out: &mut [u8]) {
    pack_decoded(cols, out, decode, |cols, out| {
        put_d(cols, |b| b.dmin, &mut out[32..64]);
        for (c, b) in cols.iter().enumerate() {
            for j in 0..8 {
                out[64 + 16 * j + c] = b.scales[j];
                out[192 + 32 * (j / 2) + 2 * c + j % 2] = b.mins[j];
            }
        }
        for j in 0..8 {
            put_nibbles(cols, 32 * j, &mut out[320 + 256 * j..320 + 256 * (j + 1)]);
        }
    });
}
