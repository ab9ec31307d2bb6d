//! A drafter-side mirror of the target's shared K/V, built from a snapshot and extended by
//! one delta per round.

use candle_core::Tensor;
use specd_wire::kv::{KvDeltaTensors, KvPair, KvSnapshot, POSITION_AXIS};

use specd_drafter::EngineError;

/// The last full-attention and last sliding layer's K/V of one sequence, rows in temporal
/// order on axis 2 (`[1, kv_heads, rows, head_dim]`), exactly as the verifier holds them.
#[derive(Debug, Clone)]
pub struct KvMirror {
    committed_len: usize,
    full: KvPair,
    /// The sliding rows and the absolute position of the first one.
    sliding: Option<(KvPair, usize)>,
}

impl KvMirror {
    pub fn from_snapshot(snapshot: KvSnapshot) -> Self {
        Self {
            committed_len: snapshot.committed_len as usize,
            full: snapshot.full,
            sliding: snapshot
                .sliding
                .map(|pair| (pair, snapshot.sliding_start as usize)),
        }
    }

    /// Tokens the mirror covers.
    pub fn committed_len(&self) -> usize {
        self.committed_len
    }

    /// The full-attention layer's rows for positions `0..committed_len`.
    pub fn full(&self) -> &KvPair {
        &self.full
    }

    /// The sliding layer's rows and the position of the first one.
    pub fn sliding(&self) -> Option<(&KvPair, usize)> {
        self.sliding.as_ref().map(|(pair, start)| (pair, *start))
    }

    /// Appends the rows of one round and drops the sliding rows the verifier evicted.
    /// Checks the delta continues the mirror and has its layout before changing anything.
    pub fn apply(&mut self, delta: &KvDeltaTensors) -> Result<(), EngineError> {
        let start = delta.start_position as usize;
        if start != self.committed_len {
            return Err(EngineError::mismatch(
                "carry.mtp.delta.start_position",
                format!(
                    "the mirror holds {} positions, the delta starts at {start}",
                    self.committed_len
                ),
            ));
        }
        check_rows_like(&self.full, &delta.full, "carry.mtp.delta.full")?;
        let sliding = match (&self.sliding, &delta.sliding) {
            (None, None) => None,
            (Some((held, first)), Some(rows)) => {
                check_rows_like(held, rows, "carry.mtp.delta.sliding")?;
                let appended = append(held, rows)?;
                let total = appended.k.dims()[POSITION_AXIS];
                let evicted = delta.sliding_evicted as usize;
                if evicted > total {
                    return Err(EngineError::invalid(
                        "carry.mtp.delta.sliding_evicted",
                        format!("{evicted} exceeds the {total} sliding rows held"),
                    ));
                }
                Some((drop_front(appended, evicted, total)?, first + evicted))
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
        self.full = append(&self.full, &delta.full)?;
        self.sliding = sliding;
        self.committed_len += delta.rows();
        Ok(())
    }
}

fn append(held: &KvPair, rows: &KvPair) -> Result<KvPair, EngineError> {
    Ok(KvPair {
        k: Tensor::cat(&[&held.k, &rows.k], POSITION_AXIS)?,
        v: Tensor::cat(&[&held.v, &rows.v], POSITION_AXIS)?,
    })
}

fn drop_front(pair: KvPair, evicted: usize, total: usize) -> Result<KvPair, EngineError> {
    if evicted == 0 {
        return Ok(pair);
    }
    Ok(KvPair {
        k: pair.k.narrow(POSITION_AXIS, evicted, total - evicted)?,
        v: pair.v.narrow(POSITION_AXIS, evicted, total - evicted)?,
    })
}

/// New rows must match the held ones in dtype, heads and head size.
fn check_rows_like(held: &KvPair, rows: &KvPair, field: &str) -> Result<(), EngineError> {
    for (name, held, rows) in [("k", &held.k, &rows.k), ("v", &held.v, &rows.v)] {
        let (h, r) = (held.dims(), rows.dims());
        let same_layout = h.len() == 4 && r.len() == 4 && h[..2] == r[..2] && h[3] == r[3];
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
