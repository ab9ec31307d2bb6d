//! The target's hidden states and shared K/V in their wire layouts.
//!
//! The model keeps K/V rows as `[kv_heads, rows, head_dim]`; the wire adds the leading batch
//! axis (`[1, kv_heads, rows, head_dim]`) and ships hidden states as `[1, 1, hidden]`.

use candle_core::Tensor;
use specd_models::gemma4::{LayerKv, SharedKv};
use specd_wire::kv::{KvDeltaTensors, KvPair, KvSnapshot};
use specd_wire::tensor::encode;
use specd_wire::WireTensor;
use tonic::Status;

/// A final-normed hidden row `[1, hidden]` as the wire's `[1, 1, hidden]`.
pub(crate) fn hidden_to_wire(hidden: &Tensor, field: &str) -> Result<WireTensor, Status> {
    let width = hidden.elem_count();
    let hidden = hidden
        .reshape((1, 1, width))
        .map_err(|e| Status::internal(format!("{field}: {e}")))?;
    Ok(encode(&hidden, field)?)
}

fn pair(layer: &LayerKv) -> candle_core::Result<KvPair> {
    Ok(KvPair {
        k: layer.keys.unsqueeze(0)?,
        v: layer.values.unsqueeze(0)?,
    })
}

fn internal(field: &str) -> impl Fn(candle_core::Error) -> Status + '_ {
    move |e| Status::internal(format!("{field}: {e}"))
}

/// The whole shared K/V of a sequence of `committed_len` tokens.
pub(crate) fn snapshot_of(committed_len: u32, kv: &SharedKv) -> Result<KvSnapshot, Status> {
    let sliding = kv
        .sliding
        .as_ref()
        .map(pair)
        .transpose()
        .map_err(internal("snapshot.sliding"))?;
    Ok(KvSnapshot {
        committed_len,
        sliding_start: match &kv.sliding {
            Some(layer) => position(layer.start, "snapshot.sliding_start")?,
            None => 0,
        },
        full: pair(&kv.full).map_err(internal("snapshot.full"))?,
        sliding,
    })
}

/// The rows one round committed, starting at `start_position`.
pub(crate) fn delta_of(
    start_position: u32,
    rows: &SharedKv,
    sliding_evicted: u32,
) -> Result<KvDeltaTensors, Status> {
    Ok(KvDeltaTensors {
        start_position,
        full: pair(&rows.full).map_err(internal("kv_delta.full"))?,
        sliding: rows
            .sliding
            .as_ref()
            .map(pair)
            .transpose()
            .map_err(internal("kv_delta.sliding"))?,
        sliding_evicted,
    })
}

/// A position or length as the wire's `uint32`.
pub(crate) fn position(value: usize, field: &str) -> Result<u32, Status> {
    u32::try_from(value)
        .map_err(|_| Status::internal(format!("{field}: {value} does not fit in 32 bits")))
}
