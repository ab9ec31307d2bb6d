//! What the router hands from the verifier to a drafter, kept in wire form: the router
//! forwards tensors, it never computes with them.

use specd_wire::{KvDelta, SnapshotChunk, WireTensor};

/// The carry of one prefill or verify round. Empty for sequences without MTP state (an
/// n-gram or draft-model drafter needs none of it).
#[derive(Debug, Clone, Default)]
pub struct WireCarry {
    /// Final-normed hidden state at the last committed position `[1, 1, H]`.
    pub hidden: Option<WireTensor>,
    /// The prefill's shared-K/V snapshot, chunked as the verifier streamed it.
    pub snapshot: Vec<SnapshotChunk>,
    /// The K/V rows a verify round committed.
    pub delta: Option<KvDelta>,
}
