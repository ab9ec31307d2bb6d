//! What the router hands from the verifier to a drafter, kept in wire form: the router
//! forwards tensors, it never computes with them.

use candle_core::{Device, Tensor};
use specd_wire::kv::{KvDeltaTensors, KvPair, POSITION_AXIS};
use specd_wire::{KvDelta, SnapshotChunk, WireTensor};

use crate::error::RemoteError;

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

/// One delta covering several consecutive rounds (rounds that drafted nothing still commit
/// rows the drafter must learn). Rows are concatenated; sliding evictions add up, which
/// leaves the mirror exactly as applying the deltas one by one would.
pub fn merge_deltas(deltas: Vec<KvDelta>) -> Result<Option<KvDelta>, RemoteError> {
    if deltas.len() <= 1 {
        return Ok(deltas.into_iter().next());
    }
    let bad = |reason: String| RemoteError::protocol("verifier", reason);
    let mut decoded = Vec::with_capacity(deltas.len());
    for (i, delta) in deltas.iter().enumerate() {
        let field = format!("kv_delta[{i}]");
        decoded.push(
            KvDeltaTensors::decode(delta, &field, &Device::Cpu).map_err(|e| bad(e.to_string()))?,
        );
    }
    let mut expected = decoded[0].start_position as usize;
    for (i, delta) in decoded.iter().enumerate() {
        if delta.start_position as usize != expected {
            return Err(bad(format!(
                "kv_delta[{i}].start_position: expected {expected}, got {}",
                delta.start_position
            )));
        }
        expected += delta.rows();
    }
    let cat =
        |pick: &dyn Fn(&KvDeltaTensors) -> Option<&KvPair>| -> Result<Option<KvPair>, RemoteError> {
            let pairs: Option<Vec<&KvPair>> = decoded.iter().map(pick).collect();
            let Some(pairs) = pairs else { return Ok(None) };
            let keys: Vec<&Tensor> = pairs.iter().map(|p| &p.k).collect();
            let values: Vec<&Tensor> = pairs.iter().map(|p| &p.v).collect();
            Ok(Some(KvPair {
                k: Tensor::cat(&keys, POSITION_AXIS).map_err(|e| bad(e.to_string()))?,
                v: Tensor::cat(&values, POSITION_AXIS).map_err(|e| bad(e.to_string()))?,
            }))
        };
    let full = cat(&|d| Some(&d.full))?.ok_or_else(|| bad("kv_delta: no full rows".into()))?;
    let sliding = cat(&|d| d.sliding.as_ref())?;
    let merged = KvDeltaTensors {
        start_position: decoded[0].start_position,
        full,
        sliding,
        sliding_evicted: decoded.iter().map(|d| d.sliding_evicted).sum(),
    };
    merged
        .encode("kv_delta")
        .map(Some)
        .map_err(|e| bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows whose values are their absolute positions.
    fn rows(from: usize, to: usize, heads: usize) -> Tensor {
        let values: Vec<f32> = (0..heads)
            .flat_map(|_| (from..to).flat_map(|p| [p as f32, p as f32]))
            .collect();
        Tensor::from_vec(values, (1, heads, to - from, 2), &Device::Cpu).unwrap()
    }

    fn delta(from: usize, to: usize, evicted: u32) -> KvDelta {
        KvDeltaTensors {
            start_position: from as u32,
            full: KvPair {
                k: rows(from, to, 1),
                v: rows(from, to, 1),
            },
            sliding: Some(KvPair {
                k: rows(from, to, 2),
                v: rows(from, to, 2),
            }),
            sliding_evicted: evicted,
        }
        .encode("delta")
        .unwrap()
    }

    #[test]
    fn one_delta_passes_through() {
        let single = delta(5, 7, 1);
        assert_eq!(merge_deltas(vec![single.clone()]).unwrap(), Some(single));
        assert_eq!(merge_deltas(Vec::new()).unwrap(), None);
    }

    #[test]
    fn consecutive_deltas_concatenate_and_add_evictions() {
        let merged = merge_deltas(vec![delta(5, 7, 1), delta(7, 8, 0), delta(8, 11, 2)])
            .unwrap()
            .unwrap();
        assert_eq!(merged, delta(5, 11, 3));
    }

    #[test]
    fn a_gap_between_deltas_is_a_protocol_error() {
        let err = merge_deltas(vec![delta(5, 7, 0), delta(8, 9, 0)]).unwrap_err();
        assert!(err.to_string().contains("start_position"), "{err}");
    }
}
