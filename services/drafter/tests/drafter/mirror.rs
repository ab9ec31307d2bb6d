//! The K/V mirror follows snapshot plus deltas row for row.

use crate::random_engine::KvMirror;
use specd_wire::kv::KvDeltaTensors;

use crate::support::*;

fn positions(t: &candle_core::Tensor) -> Vec<f32> {
    // Head 0, dim 0 of every row: the absolute position the test data encodes.
    t.narrow(1, 0, 1)
        .unwrap()
        .narrow(3, 0, 1)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn decoded(from: usize, to: usize, evicted: u32) -> KvDeltaTensors {
    KvDeltaTensors::decode(
        &delta(from, to, evicted),
        "delta",
        &candle_core::Device::Cpu,
    )
    .unwrap()
}

#[test]
fn deltas_append_rows_and_evict_sliding_ones() {
    let mut mirror = KvMirror::from_snapshot(snapshot(10, 4));
    mirror.apply(&decoded(10, 13, 2)).unwrap();
    mirror.apply(&decoded(13, 14, 0)).unwrap();
    assert_eq!(mirror.committed_len(), 14);
    let full: Vec<f32> = (0..14).map(|p| p as f32).collect();
    assert_eq!(positions(&mirror.full().k), full);
    let (sliding, start) = mirror.sliding().unwrap();
    assert_eq!(start, 6);
    let kept: Vec<f32> = (6..14).map(|p| p as f32).collect();
    assert_eq!(positions(&sliding.k), kept);
    assert_eq!(
        positions(&sliding.v),
        kept.iter().map(|p| p + 0.5).collect::<Vec<_>>()
    );
}

#[test]
fn a_delta_that_does_not_continue_the_mirror_changes_nothing() {
    let mut mirror = KvMirror::from_snapshot(snapshot(10, 4));
    let err = mirror.apply(&decoded(11, 12, 0)).unwrap_err();
    assert!(err.to_string().contains("start_position"), "{err}");
    let err = mirror.apply(&decoded(10, 11, 99)).unwrap_err();
    assert!(err.to_string().contains("sliding_evicted"), "{err}");
    assert_eq!(mirror.committed_len(), 10);
    mirror.apply(&decoded(10, 11, 0)).unwrap();
    assert_eq!(mirror.committed_len(), 11);
}
