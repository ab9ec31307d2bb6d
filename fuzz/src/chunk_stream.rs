//! A snapshot chunk stream as one byte string: a limit selector, then each chunk as a
//! little-endian `u16` length and that many bytes of an encoded `specd.v1.SnapshotChunk`.

use prost::Message;
use specd_wire::SnapshotChunk;

use crate::Reader;

/// Snapshot size limits the assembler is tried with, picked by the first input byte. All are
/// small: the assembler reserves the declared size up front, and the point here is the
/// stream checks, not the allocator.
pub const LIMITS: [usize; 4] = [1 << 20, 4096, 256, 0];

/// The decoded stream: the limit, then each frame's chunk (`None` for a frame that is not a
/// valid message).
pub struct ChunkStream {
    pub max_total_bytes: usize,
    pub chunks: Vec<Option<SnapshotChunk>>,
}

pub fn parse(data: &[u8]) -> ChunkStream {
    let mut reader = Reader::new(data);
    let max_total_bytes = LIMITS[usize::from(reader.u8()) % LIMITS.len()];
    let mut chunks = Vec::new();
    while !reader.is_empty() {
        let len = usize::from(reader.u16());
        chunks.push(SnapshotChunk::decode(reader.bytes(len)).ok());
    }
    ChunkStream {
        max_total_bytes,
        chunks,
    }
}

/// The input that [`parse`] reads back as `chunks` under `LIMITS[limit]`.
pub fn encode(limit: u8, chunks: &[SnapshotChunk]) -> Vec<u8> {
    let mut out = vec![limit];
    for chunk in chunks {
        let bytes = chunk.encode_to_vec();
        let len = u16::try_from(bytes.len()).expect("seed chunks are under 64 KiB");
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    out
}
