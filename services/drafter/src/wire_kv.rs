//! The server edge for K/V: wire snapshots and deltas (`[1, kv_heads, rows, head_dim]`, see
//! `kv.proto`) as the model-side rows engines take (`[kv_heads, rows, head_dim]` from an
//! absolute start position), and the wire's hidden state as the model's.

use candle_core::Tensor;
use specd_wire::kv::{KvDeltaTensors, KvPair, KvSnapshot};

use crate::engine::{CommittedKv, LayerKv, SharedKv};

/// One layer's wire rows from position `start`.
fn layer(pair: KvPair, start: usize) -> candle_core::Result<LayerKv> {
    Ok(LayerKv {
        keys: pair.k.squeeze(0)?,
        values: pair.v.squeeze(0)?,
        start,
    })
}

/// An assembled snapshot as the shared K/V a session opens from.
pub fn snapshot_kv(snapshot: KvSnapshot) -> candle_core::Result<SharedKv> {
    let sliding_start = snapshot.sliding_start as usize;
    Ok(SharedKv {
        full: layer(snapshot.full, 0)?,
        sliding: snapshot
            .sliding
            .map(|pair| layer(pair, sliding_start))
            .transpose()?,
    })
}

/// A decoded per-round delta as the rows the round committed.
pub fn committed_kv(delta: KvDeltaTensors) -> candle_core::Result<CommittedKv> {
    let start = delta.start_position as usize;
    Ok(CommittedKv {
        rows: SharedKv {
            full: layer(delta.full, start)?,
            sliding: delta.sliding.map(|pair| layer(pair, start)).transpose()?,
        },
        sliding_evicted: delta.sliding_evicted as usize,
    })
}

/// The wire's hidden state `[1, 1, H]` as the model's `[1, H]`.
pub fn model_hidden(hidden: Tensor) -> candle_core::Result<Tensor> {
    let width = hidden.elem_count();
    hidden.reshape((1, width))
}
