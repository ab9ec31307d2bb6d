//! Several rounds' K/V deltas as one: an MTP session that skipped drafting for some rounds
//! (speculation off, a resync) learns every row those rounds committed in one Draft call.
//! The router forwards the deltas as the verifier sent them; tensors are joined here, where
//! they are decoded anyway.

use candle_core::Tensor;
use specd_wire::kv::{KvDeltaTensors, KvPair, POSITION_AXIS};

/// Deltas of consecutive rounds as one delta: rows concatenated in order, sliding evictions
/// added up, which leaves a mirror exactly as applying them one by one would. `fields`
/// names each delta for errors; a delta that does not start where the one before it ends is
/// refused naming its `start_position`.
pub fn concat_deltas(
    parts: Vec<KvDeltaTensors>,
    fields: &[String],
) -> Result<Option<KvDeltaTensors>, String> {
    if parts.len() <= 1 {
        return Ok(parts.into_iter().next());
    }
    let mut expected = parts[0].start_position as usize;
    for (delta, field) in parts.iter().zip(fields) {
        if delta.start_position as usize != expected {
            return Err(format!(
                "{field}.start_position: expected {expected}, got {}",
                delta.start_position
            ));
        }
        expected += delta.rows();
    }
    let cat =
        |pick: &dyn Fn(&KvDeltaTensors) -> Option<&KvPair>| -> Result<Option<KvPair>, String> {
            let pairs: Option<Vec<&KvPair>> = parts.iter().map(pick).collect();
            let Some(pairs) = pairs else { return Ok(None) };
            let keys: Vec<&Tensor> = pairs.iter().map(|p| &p.k).collect();
            let values: Vec<&Tensor> = pairs.iter().map(|p| &p.v).collect();
            Ok(Some(KvPair {
                k: Tensor::cat(&keys, POSITION_AXIS).map_err(|e| e.to_string())?,
                v: Tensor::cat(&values, POSITION_AXIS).map_err(|e| e.to_string())?,
            }))
        };
    let full = cat(&|d| Some(&d.full))?.ok_or("no full rows")?;
    // Either every delta has sliding rows or none has.
    let sliding = if parts.iter().all(|d| d.sliding.is_some()) {
        cat(&|d| d.sliding.as_ref())?
    } else if parts.iter().all(|d| d.sliding.is_none()) {
        None
    } else {
        return Err(format!(
            "{}: some deltas carry sliding rows and some do not",
            fields.join(", ")
        ));
    };
    Ok(Some(KvDeltaTensors {
        start_position: parts[0].start_position,
        full,
        sliding,
        sliding_evicted: parts.iter().map(|d| d.sliding_evicted).sum(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use specd_wire::KvDelta;

    /// Rows whose values are their absolute positions.
    fn rows(from: usize, to: usize, heads: usize) -> Tensor {
        let values: Vec<f32> = (0..heads)
            .flat_map(|_| (from..to).flat_map(|p| [p as f32, p as f32]))
            .collect();
        Tensor::from_vec(values, (1, heads, to - from, 2), &Device::Cpu).unwrap()
    }

    fn delta(from: usize, to: usize, evicted: u32) -> KvDeltaTensors {
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
    }

    fn wire(delta: KvDeltaTensors) -> KvDelta {
        delta.encode("delta").unwrap()
    }

    fn fields(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("delta[{i}]")).collect()
    }

    #[test]
    fn one_delta_passes_through() {
        let single = concat_deltas(vec![delta(5, 7, 1)], &fields(1)).unwrap();
        assert_eq!(single.map(wire), Some(wire(delta(5, 7, 1))));
        assert!(concat_deltas(Vec::new(), &[]).unwrap().is_none());
    }

    #[test]
    fn consecutive_deltas_concatenate_and_add_evictions() {
        let parts = vec![delta(5, 7, 1), delta(7, 8, 0), delta(8, 11, 2)];
        let merged = concat_deltas(parts, &fields(3)).unwrap().unwrap();
        assert_eq!(wire(merged), wire(delta(5, 11, 3)));
    }

    #[test]
    fn a_gap_between_deltas_is_refused_naming_the_delta() {
        let err = concat_deltas(vec![delta(5, 7, 0), delta(8, 9, 0)], &fields(2)).unwrap_err();
        assert!(err.contains("delta[1].start_position"), "{err}");
    }
}
