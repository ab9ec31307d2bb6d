//! A drafter-side mirror of the target's shared K/V, built from a snapshot and extended by
//! one round's committed rows at a time.

use candle_core::Tensor;

use specd_drafter::{CommittedKv, EngineError, LayerKv, SharedKv};

/// Axis of the positions in the model-side rows `[kv_heads, rows, head_dim]`.
const POSITION_AXIS: usize = 1;

/// The last full-attention and last sliding layer's K/V of one sequence, rows in temporal
/// order, exactly as the verifier holds them (including the sliding rows it evicted).
#[derive(Debug, Clone)]
pub struct KvMirror {
    committed_len: usize,
    full: LayerKv,
    sliding: Option<LayerKv>,
}

impl KvMirror {
    pub fn from_snapshot(snapshot: SharedKv) -> Self {
        Self {
            committed_len: snapshot.full.end(),
            full: snapshot.full,
            sliding: snapshot.sliding,
        }
    }

    /// Tokens the mirror covers.
    pub fn committed_len(&self) -> usize {
        self.committed_len
    }

    /// The full-attention layer's rows for positions `0..committed_len`.
    pub fn full(&self) -> &LayerKv {
        &self.full
    }

    /// The sliding layer's rows (`start` is the position of the first one).
    pub fn sliding(&self) -> Option<&LayerKv> {
        self.sliding.as_ref()
    }

    /// Appends the rows of one round and drops the sliding rows the verifier evicted.
    /// Checks the rows continue the mirror and have its layout before changing anything.
    pub fn apply(&mut self, delta: &CommittedKv) -> Result<(), EngineError> {
        let start = delta.start_position();
        if start != self.committed_len {
            return Err(EngineError::mismatch(
                "carry.mtp.delta.start_position",
                format!(
                    "the mirror holds {} positions, the delta starts at {start}",
                    self.committed_len
                ),
            ));
        }
        check_rows_like(&self.full, &delta.rows.full, "carry.mtp.delta.full")?;
        let sliding = match (&self.sliding, &delta.rows.sliding) {
            (None, None) => None,
            (Some(held), Some(rows)) => {
                check_rows_like(held, rows, "carry.mtp.delta.sliding")?;
                let appended = append(held, rows)?;
                let total = appended.rows();
                let evicted = delta.sliding_evicted;
                if evicted > total {
                    return Err(EngineError::invalid(
                        "carry.mtp.delta.sliding_evicted",
                        format!("{evicted} exceeds the {total} sliding rows held"),
                    ));
                }
                Some(drop_front(appended, evicted, total)?)
            }
            (Some(_), None) => {
                return Err(EngineError::invalid(
                    "carry.mtp.delta.sliding_k",
                    "the snapshot had sliding tensors, the delta has none",
                ))
            }
            (None, Some(_)) => {
                return Err(EngineError::invalid(
                    "carry.mtp.delta.sliding_k",
                    "the snapshot had no sliding tensors, the delta has some",
                ))
            }
        };
        self.full = append(&self.full, &delta.rows.full)?;
        self.sliding = sliding;
        self.committed_len += delta.rows();
        Ok(())
    }
}

fn append(held: &LayerKv, rows: &LayerKv) -> Result<LayerKv, EngineError> {
    Ok(LayerKv {
        keys: Tensor::cat(&[&held.keys, &rows.keys], POSITION_AXIS)?,
        values: Tensor::cat(&[&held.values, &rows.values], POSITION_AXIS)?,
        start: held.start,
    })
}

fn drop_front(layer: LayerKv, evicted: usize, total: usize) -> Result<LayerKv, EngineError> {
    if evicted == 0 {
        return Ok(layer);
    }
    Ok(LayerKv {
        keys: layer.keys.narrow(POSITION_AXIS, evicted, total - evicted)?,
        values: layer
            .values
            .narrow(POSITION_AXIS, evicted, total - evicted)?,
        start: layer.start + evicted,
    })
}

/// New rows must match the held ones in dtype, heads and head size.
fn check_rows_like(held: &LayerKv, rows: &LayerKv, field: &str) -> Result<(), EngineError> {
    for (name, held, rows) in [
        ("k", &held.keys, &rows.keys),
        ("v", &held.values, &rows.values),
    ] {
        let (h, r) = (held.dims(), rows.dims());
        let same_layout = h.len() == 3 && r.len() == 3 && h[0] == r[0] && h[2] == r[2];
        if held.dtype() != rows.dtype() || !same_layout {
            return Err(EngineError::invalid(
                &format!("{field}_{name}"),
                format!(
                    "rows {:?} {r:?} do not match the mirror's {:?} {h:?}",
                    rows.dtype(),
                    held.dtype()
                ),
            ));
        }
    }
    Ok(())
}
