//! The shared K/V state that travels from the verifier to an MTP drafter: whole snapshots,
//! chunked under the message limit, and one [`KvDelta`](crate::KvDelta) per round.
//!
//! Every K/V tensor has the layout `[1, kv_heads, positions, head_dim]` (see `kv.proto`).

mod delta;
mod error;
mod header;
mod snapshot_assembler;
mod snapshot_chunker;

use candle_core::Tensor;

pub use delta::KvDeltaTensors;
pub use error::KvWireError;
pub use snapshot_assembler::SnapshotAssembler;
pub use snapshot_chunker::snapshot_chunks;

/// Axis of the positions in every K/V tensor.
pub const POSITION_AXIS: usize = 2;

/// Keys and values of one layer.
#[derive(Debug, Clone)]
pub struct KvPair {
    pub k: Tensor,
    pub v: Tensor,
}

/// The mirrored K/V of one sequence at a committed length, as candle tensors.
#[derive(Debug, Clone)]
pub struct KvSnapshot {
    /// Tokens in the target cache; the full-attention tensors hold this many positions.
    pub committed_len: u32,
    /// Absolute position of the first sliding row (0 without sliding layers).
    pub sliding_start: u32,
    /// The last full-attention layer.
    pub full: KvPair,
    /// The last sliding-window layer, if the target has sliding layers.
    pub sliding: Option<KvPair>,
}
