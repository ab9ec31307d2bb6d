//! The K/V mirror follows snapshot plus deltas row for row.

use crate::random_engine::KvMirror;
use specd_drafter::wire_kv::{committed_kv, snapshot_kv};
use specd_drafter::CommittedKv;
use specd_wire::kv::KvDeltaTensors;

use crate::support::*;

fn positions(t: &candle_core::Tensor) -> Vec<f32> {
    // Head 0, dim 0 of every row: the absolute position the test data encodes.
    t.narrow(0, 0, 1)
        .unwrap()
        .narrow(2, 0, 1)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// The delta as the server edge hands it to an engine.
fn decoded(from: usize, to: usize, evicted: u32) -> CommittedKv {
    let wire = KvDeltaTensors::decode(
        &delta(from, to, evicted),
        "delta",
        &candle_core::Device::Cpu,
    )
    .unwrap();
    committed_kv(wire).unwrap()
}

fn mirror_of(len: usize, sliding_start: usize) -> KvMirror {
    KvMirror::from_snapshot(snapshot_kv(snapshot(len, sliding_start)).unwrap())
}

#[test]
fn deltas_append_rows_and_evict_sliding_ones() {
    let mut mirror = mirror_of(10, 4);
    mirror.apply(&decoded(10, 13, 2)).unwrap();
    mirror.apply(&decoded(13, 14, 0)).unwrap();
    assert_eq!(mirror.committed_len(), 14);
    let full: Vec<f32> = (0..14).map(|p| p as f32).collect();
    assert_eq!(positions(&mirror.full().keys), full);
    let sliding = mirror.sliding().unwrap();
    assert_eq!(sliding.start, 6);
    let kept: Vec<f32> = (6..14).map(|p| p as f32).collect();
    assert_eq!(positions(&sliding.keys), kept);
    assert_eq!(
        positions(&sliding.values),
        kept.iter().map(|p| p + 0.5).collect::<Vec<_>>()
    );
}

#[test]
fn a_delta_that_does_not_continue_the_mirror_changes_nothing() {
    let mut mirror = mirror_of(10, 4);
    let err = mirror.apply(&decoded(11, 12, 0)).unwrap_err();
    assert!(err.to_string().contains("start_position"), "{err}");
    let err = mirror.apply(&decoded(10, 11, 99)).unwrap_err();
    assert!(err.to_string().contains("sliding_evicted"), "{err}");
    assert_eq!(mirror.committed_len(), 10);
    mirror.apply(&decoded(10, 11, 0)).unwrap();
    assert_eq!(mirror.committed_len(), 11);
}
