//! Weights repacked at load into tiles of 16 interleaved output columns.
//!
//! A packed matrix is a sequence of tiles; a tile holds 16 output columns (the last one is
//! padded with zero columns) over the whole reduction length, block after block. Within a
//! block, bytes are arranged so that a 64-byte load gives 4 consecutive reduction values of
//! each of the 16 columns, one column per 32-bit lane. Layouts per format (16 columns, one
//! GGUF block):
//!
//! - Q4_0 (288 B): `d[16]` f16, then 4 chunks; chunk `h` holds values `4h..4h+4` in its low
//!   nibbles and `4h+16..4h+20` in its high nibbles.
//! - Q5_0 (352 B): as Q4_0, then 64 bytes whose bit `g` of byte `4c+t` is the fifth bit of
//!   value `4g+t` of column `c`.
//! - Q8_0 (544 B): `d[16]`, then 8 chunks of 4 signed values.
//! - Q4_K (2368 B): `d[16]`, `dmin[16]`, `scales[8][16]`, `mins[4][16][2]` (bytes; mins of
//!   sub-blocks `2q`, `2q + 1` side by side), then per 32-value sub-block the 4 nibble chunks
//!   of Q4_0.
//! - Q6_K (3360 B): `d[16]`, `scales[8][16][2]` (signed; sub-blocks `2p`, `2p + 1` side by
//!   side), then per 32-value span 4 chunks of low nibbles (as Q4_0) and 2 chunks of high
//!   2-bit pairs (bits `2i..2i+2` of chunk `p` belong to group `4p+i`).
//! - F32 / F16 / BF16: per reduction index, the 16 columns' values.
//!
//! Every layout but Q4_K's is exactly as large as the GGUF rows it came from.
//!
//! Weights always read together (a SwiGLU's gate and up) can share one allocation with
//! their tiles interleaved, so that the worker computing tile `t` of both reads one
//! contiguous run of memory.

use std::sync::Arc;

use super::buffer::AlignedBytes;
use super::format::WeightFormat;
use super::pool::ThreadPool;

/// Output columns per tile.
pub const TILE: usize = 16;

/// A weight `[out, inp]` in tiles, ready for the kernels.
pub struct PackedMatrix {
    format: WeightFormat,
    out: usize,
    inp: usize,
    data: Arc<AlignedBytes>,
    /// Where tile 0 starts in `data`.
    first: usize,
    /// Bytes from one of this matrix's tiles to the next (a tile's size unless interleaved).
    stride: usize,
}

/// Why a weight cannot be packed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackError {
    #[error("a row of {inp} values is not a whole number of {format:?} blocks of {block}")]
    PartialBlock {
        format: WeightFormat,
        inp: usize,
        block: usize,
    },
    #[error("{found} bytes of data, a [{out}, {inp}] {format:?} weight has {expected}")]
    Size {
        format: WeightFormat,
        out: usize,
        inp: usize,
        expected: usize,
        found: usize,
    },
}

impl PackedMatrix {
    /// Packs GGUF row data (`out` rows of `inp` values, ggml block layout).
    pub fn from_gguf(
        format: WeightFormat,
        out: usize,
        inp: usize,
        raw: &[u8],
        pool: &ThreadPool,
    ) -> Result<Self, PackError> {
        let [matrix] = Self::interleaved_from_gguf(format, out, inp, [raw], pool)?;
        Ok(matrix)
    }

    /// Packs `N` GGUF weights of one format and shape into one allocation, tile `t` of
    /// each weight after tile `t` of the one before.
    pub fn interleaved_from_gguf<const N: usize>(
        format: WeightFormat,
        out: usize,
        inp: usize,
        raws: [&[u8]; N],
        pool: &ThreadPool,
    ) -> Result<[Self; N], PackError> {
        let row_bytes = format.row_bytes(inp).ok_or(PackError::PartialBlock {
            format,
            inp,
            block: format.block_len(),
        })?;
        if let Some(raw) = raws.iter().find(|raw| raw.len() != out * row_bytes) {
            return Err(PackError::Size {
                format,
                out,
                inp,
                expected: out * row_bytes,
                found: raw.len(),
            });
        }
        let blocks = inp / format.block_len();
        let tile_bytes = blocks * format.tile_block_bytes();
        let tiles = out.div_ceil(TILE);
        let mut data = AlignedBytes::zeroed(N * tiles * tile_bytes);
        pool.for_each_chunk_mut(data.as_mut_slice(), tile_bytes, false, |chunk, tile| {
            let (t, raw) = (chunk / N, raws[chunk % N]);
            let cols: Vec<&[u8]> = (t * TILE..((t + 1) * TILE).min(out))
                .map(|c| &raw[c * row_bytes..(c + 1) * row_bytes])
                .collect();
            pack_tile(format, &cols, blocks, tile);
        });
        let data = Arc::new(data);
        Ok(std::array::from_fn(|m| Self {
            format,
            out,
            inp,
            data: Arc::clone(&data),
            first: m * tile_bytes,
            stride: N * tile_bytes,
        }))
    }

    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        self.out
    }

    /// Reduction length.
    pub fn in_features(&self) -> usize {
        self.inp
    }

    pub fn tiles(&self) -> usize {
        self.out.div_ceil(TILE)
    }

    pub(crate) fn blocks(&self) -> usize {
        self.inp / self.format.block_len()
    }

    pub(crate) fn tile_bytes(&self) -> usize {
        self.blocks() * self.format.tile_block_bytes()
    }

    pub(crate) fn tile_ptr(&self, tile: usize) -> *const u8 {
        self.data.as_slice()[self.first + tile * self.stride..].as_ptr()
    }

    /// Whether `next`'s tile `t` directly follows this matrix's tile `t` in memory.
    pub(crate) fn tiles_precede(&self, next: &PackedMatrix) -> bool {
        Arc::ptr_eq(&self.data, &next.data)
            && self.stride == next.stride
            && next.first == self.first + self.tile_bytes()
    }

    /// Bytes of this matrix's tiles, which are also the bytes one pass over it streams.
    pub fn bytes(&self) -> usize {
        self.tiles() * self.tile_bytes()
    }
}

/// Writes one tile from up to 16 column rows (missing columns stay zero), block by block
/// with the format's packer.
fn pack_tile(format: WeightFormat, cols: &[&[u8]], blocks: usize, tile: &mut [u8]) {
    let table = format.table();
    let (bb, tb) = (table.block_bytes, table.tile_block_bytes);
    let mut block_cols: [&[u8]; TILE] = [&[]; TILE];
    let cols = &cols[..cols.len().min(TILE)];
    for b in 0..blocks {
        for (slot, col) in block_cols.iter_mut().zip(cols) {
            *slot = &col[b * bb..(b + 1) * bb];
        }
        (table.pack_block)(&block_cols[..cols.len()], &mut tile[b * tb..(b + 1) * tb]);
    }
}
