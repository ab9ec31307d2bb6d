//! The per-round K/V delta as candle tensors.

use candle_core::Device;

use super::error::{inconsistent, KvWireError};
use super::header::check_pair;
use super::KvPair;
use crate::tensor::{encode, from_le_bytes, TensorCodecError, TensorLayout};
use crate::{KvDelta, WireTensor};

/// The K/V rows one verify round committed (see `KvDelta` in `kv.proto`).
#[derive(Debug, Clone)]
pub struct KvDeltaTensors {
    /// Absolute position of the first row (the committed length before the round).
    pub start_position: u32,
    /// Last full-attention layer, `[1, kv_heads, n, head_dim]`.
    pub full: KvPair,
    /// Last sliding layer at the same n positions, if the target has sliding layers.
    pub sliding: Option<KvPair>,
    /// Rows the receiver drops from the front of its sliding mirror after appending.
    pub sliding_evicted: u32,
}

impl KvDeltaTensors {
    /// Rows (committed positions) the delta carries.
    pub fn rows(&self) -> usize {
        self.full
            .k
            .dims()
            .get(super::POSITION_AXIS)
            .copied()
            .unwrap_or(0)
    }

    /// Encodes the delta, checking it the way a receiver does.
    pub fn encode(&self, field: &str) -> Result<KvDelta, KvWireError> {
        let wire = KvDelta {
            start_position: self.start_position,
            full_k: Some(encode(&self.full.k, &format!("{field}.full_k"))?),
            full_v: Some(encode(&self.full.v, &format!("{field}.full_v"))?),
            sliding_k: match &self.sliding {
                Some(s) => Some(encode(&s.k, &format!("{field}.sliding_k"))?),
                None => None,
            },
            sliding_v: match &self.sliding {
                Some(s) => Some(encode(&s.v, &format!("{field}.sliding_v"))?),
                None => None,
            },
            sliding_evicted: self.sliding_evicted,
        };
        check_delta(&wire, field)?;
        Ok(wire)
    }

    /// Validates a wire delta and decodes it onto `device`. Shapes are checked before any
    /// tensor is built.
    pub fn decode(wire: &KvDelta, field: &str, device: &Device) -> Result<Self, KvWireError> {
        let layouts = check_delta(wire, field)?;
        let tensor = |wire: &WireTensor, layout: &TensorLayout, name: &str| {
            from_le_bytes(layout, &wire.data, &format!("{field}.{name}"), device)
        };
        let (full_k, full_v) = (&layouts.full.0, &layouts.full.1);
        let full = KvPair {
            k: tensor(required(&wire.full_k, field, "full_k")?, full_k, "full_k")?,
            v: tensor(required(&wire.full_v, field, "full_v")?, full_v, "full_v")?,
        };
        let sliding = match (&layouts.sliding, &wire.sliding_k, &wire.sliding_v) {
            (Some((k_layout, v_layout)), Some(k), Some(v)) => Some(KvPair {
                k: tensor(k, k_layout, "sliding_k")?,
                v: tensor(v, v_layout, "sliding_v")?,
            }),
            _ => None,
        };
        Ok(Self {
            start_position: wire.start_position,
            full,
            sliding,
            sliding_evicted: wire.sliding_evicted,
        })
    }
}

struct DeltaLayouts {
    full: (TensorLayout, TensorLayout),
    sliding: Option<(TensorLayout, TensorLayout)>,
}

/// Checks every tensor of a wire delta and how they agree: K with V, sliding rows with full
/// rows, at least one row, no eviction without sliding tensors.
fn check_delta(wire: &KvDelta, field: &str) -> Result<DeltaLayouts, KvWireError> {
    let layout = |t: &WireTensor, name: &str| -> Result<TensorLayout, KvWireError> {
        let field = format!("{field}.{name}");
        let layout = TensorLayout::parse(&field, &t.dtype, &t.shape)?;
        layout.check_byte_len(&field, t.data.len())?;
        Ok(layout)
    };
    let full_k = layout(required(&wire.full_k, field, "full_k")?, "full_k")?;
    let full_v = layout(required(&wire.full_v, field, "full_v")?, "full_v")?;
    let rows = check_pair(field, "full", &full_k, &full_v, None)?;
    if rows == 0 {
        return Err(inconsistent(
            &format!("{field}.full_k.shape"),
            "a round commits at least one position, got 0 rows",
        ));
    }
    let sliding = match (&wire.sliding_k, &wire.sliding_v) {
        (None, None) => {
            if wire.sliding_evicted != 0 {
                return Err(inconsistent(
                    &format!("{field}.sliding_evicted"),
                    format!(
                        "must be 0 without sliding tensors, got {}",
                        wire.sliding_evicted
                    ),
                ));
            }
            None
        }
        (Some(k), Some(v)) => {
            let k = layout(k, "sliding_k")?;
            let v = layout(v, "sliding_v")?;
            check_pair(field, "sliding", &k, &v, Some(rows))?;
            Some((k, v))
        }
        _ => {
            return Err(inconsistent(
                field,
                "sliding_k and sliding_v must be both set or both unset",
            ))
        }
    };
    Ok(DeltaLayouts {
        full: (full_k, full_v),
        sliding,
    })
}

fn required<'a>(
    tensor: &'a Option<WireTensor>,
    field: &str,
    name: &str,
) -> Result<&'a WireTensor, TensorCodecError> {
    tensor.as_ref().ok_or_else(|| TensorCodecError::Missing {
        field: format!("{field}.{name}"),
    })
}
