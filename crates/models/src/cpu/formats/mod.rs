//! One file per weight format the CPU engine runs natively, each with its table
//! ([`FormatTable`], in the manner of ggml's type traits): its sizes, the activation its
//! kernel takes, how a GGUF row dequantizes and how 16 columns' blocks pack into one tile
//! block (the layouts are in `pack.rs`). The tile kernels, generic over the lanes of a
//! kernel set, are chosen per format in `tile.rs`.

use candle_core::quantized::GgmlDType;
use half::f16;

use super::format::{ActivationKind, WeightFormat};
use super::pack::TILE;

mod dense;
mod q4_0;
mod q4k;
mod q5_0;
mod q6k;
mod q8_0;

/// What the engine knows of one weight format.
pub(crate) struct FormatTable {
    pub ggml: GgmlDType,
    /// Values per GGUF block.
    pub block_len: usize,
    /// Bytes per GGUF block.
    pub block_bytes: usize,
    /// Bytes of one block of 16 interleaved columns in the packed layout.
    pub tile_block_bytes: usize,
    pub activation: ActivationKind,
    /// Decodes whole GGUF blocks into `out.len()` f32 values.
    pub dequantize: fn(&[u8], &mut [f32]),
    /// Writes one tile block from up to 16 columns' GGUF blocks (missing columns stay
    /// zero).
    pub pack_block: fn(&[&[u8]], &mut [u8]),
}

impl FormatTable {
    /// A format of `block_len` values in `block_bytes` bytes a block, packed as 16 blocks
    /// side by side.
    const fn new(
        ggml: GgmlDType,
        (block_len, block_bytes): (usize, usize),
        activation: ActivationKind,
        dequantize: fn(&[u8], &mut [f32]),
        pack_block: fn(&[&[u8]], &mut [u8]),
    ) -> Self {
        Self {
            ggml,
            block_len,
            block_bytes,
            tile_block_bytes: TILE * block_bytes,
            activation,
            dequantize,
            pack_block,
        }
    }

    /// Its block's size in the packed layout where that is not 16 GGUF blocks.
    const fn with_tile_block_bytes(self, tile_block_bytes: usize) -> Self {
        Self {
            tile_block_bytes,
            ..self
        }
    }

    /// Values and bytes of a GGUF block.
    fn block(&self) -> (usize, usize) {
        (self.block_len, self.block_bytes)
    }
}

/// The table of `format`.
pub(crate) fn table(format: WeightFormat) -> &'static FormatTable {
    match format {
        WeightFormat::F32 => &dense::F32,
        WeightFormat::F16 => &dense::F16,
        WeightFormat::BF16 => &dense::BF16,
        WeightFormat::Q4_0 => &q4_0::TABLE,
        WeightFormat::Q5_0 => &q5_0::TABLE,
        WeightFormat::Q8_0 => &q8_0::TABLE,
        WeightFormat::Q4K => &q4k::TABLE,
        WeightFormat::Q6K => &q6k::TABLE,
    }
}

/// One quantized GGUF block decoded to its integer codes (natural value order) and scales.
#[derive(Clone, Copy)]
struct DecodedBlock {
    /// `q[i]`: the unsigned code of value `i` (K-quants, Q4_0, Q5_0) or the signed code as
    /// a byte (Q8_0).
    q: [u8; 256],
    d: u16,
    /// Q4_K: the super-block min scale.
    dmin: u16,
    /// Q4_K: 8 sub-block scales; Q6_K: 16 signed sub-block scales (as bytes).
    scales: [u8; 16],
    /// Q4_K: 8 sub-block mins.
    mins: [u8; 8],
}

impl DecodedBlock {
    const EMPTY: Self = Self {
        q: [0; 256],
        d: 0,
        dmin: 0,
        scales: [0; 16],
        mins: [0; 8],
    };
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Splits `bytes` into codes in value order: the low nibble of byte `j` is value `j`, its
/// high nibble value `j + bytes.len()` (ggml's layout for Q4_0, Q5_0 and each 32-byte run of
/// Q4_K).
fn split_nibbles(bytes: &[u8], q: &mut [u8]) {
    let n = bytes.len();
    for (j, &byte) in bytes.iter().enumerate() {
        q[j] = byte & 0x0f;
        q[j + n] = byte >> 4;
    }
}

/// Dequantizes `row` block by block: each block decoded, then `value(block, d, i)` for its
/// value `i`, `d` being the block's scale as f32.
#[inline(always)]
fn dequantize_blocks(
    row: &[u8],
    out: &mut [f32],
    table: &FormatTable,
    decode: impl Fn(&[u8]) -> DecodedBlock,
    value: impl Fn(&DecodedBlock, f32, usize) -> f32,
) {
    let (block_len, block_bytes) = table.block();
    for (o, block) in out.chunks_mut(block_len).zip(row.chunks_exact(block_bytes)) {
        let b = decode(block);
        let d = f16::from_bits(b.d).to_f32();
        for (i, v) in o.iter_mut().enumerate() {
            *v = value(&b, d, i);
        }
    }
}

/// Packs a tile block of quantized columns: each column's block decoded, their scales
/// `d[16]` first, then `layout` writes the rest.
#[inline(always)]
fn pack_decoded(
    cols: &[&[u8]],
    out: &mut [u8],
    decode: impl Fn(&[u8]) -> DecodedBlock,
    layout: impl Fn(&[DecodedBlock], &mut [u8]),
) {
    let mut decoded = [DecodedBlock::EMPTY; TILE];
    for (slot, col) in decoded.iter_mut().zip(cols) {
        *slot = decode(col);
    }
    let decoded = &decoded[..cols.len().min(TILE)];
    put_d(decoded, |b| b.d, &mut out[..32]);
    layout(decoded, out);
}

/// Byte `4c + t` of a 64-byte chunk: column `c`, reduction offset `t`.
fn chunk_at(c: usize, t: usize) -> usize {
    4 * c + t
}

/// 4 chunks of nibbles for 32 values starting at `base`: chunk `h` holds groups `h` (low)
/// and `h + 4` (high).
fn put_nibbles(cols: &[DecodedBlock], base: usize, out: &mut [u8]) {
    for h in 0..4 {
        for (c, b) in cols.iter().enumerate() {
            for t in 0..4 {
                let lo = b.q[base + 4 * h + t] & 0x0f;
                let hi = b.q[base + 4 * (h + 4) + t] & 0x0f;
                out[64 * h + chunk_at(c, t)] = lo | (hi << 4);
            }
        }
    }
}

fn put_d(cols: &[DecodedBlock], field: impl Fn(&DecodedBlock) -> u16, out: &mut [u8]) {
    for (c, b) in cols.iter().enumerate() {
        out[2 * c..2 * c + 2].copy_from_slice(&field(b).to_le_bytes());
    }
}
