//! Shared-K/V snapshots and per-round deltas: chunking, reassembly and every way a stream or
//! delta can be malformed.

use bytes::Bytes;
use candle_core::{DType, Device, Tensor};
use prost::Message;
use specd_wire::drafter::{open_request, OpenRequest};
use specd_wire::kv::{
    snapshot_chunks, KvDeltaTensors, KvPair, KvSnapshot, KvWireError, SnapshotAssembler,
};
use specd_wire::limits::CHUNK_ENVELOPE_BYTES;
use specd_wire::tensor::TensorCodecError;
use specd_wire::{
    snapshot_chunk, KvDelta, KvPart, SnapshotChunk, SnapshotData, SnapshotHeader, TensorSpec,
};

const CPU: Device = Device::Cpu;

/// A `[1, heads, rows, head_dim]` tensor whose every element is distinct.
fn kv(heads: usize, rows: usize, head_dim: usize, offset: f32, dtype: DType) -> Tensor {
    let n = heads * rows * head_dim;
    Tensor::arange(offset, offset + n as f32, &CPU)
        .unwrap()
        .reshape((1, heads, rows, head_dim))
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// A Gemma-like snapshot: a full layer with 2 heads of 16 and a sliding layer with 4 heads of
/// 8 holding the last `window` positions.
fn snapshot(committed: usize, window: usize, dtype: DType) -> KvSnapshot {
    let sliding_rows = committed.min(window);
    KvSnapshot {
        committed_len: committed as u32,
        sliding_start: (committed - sliding_rows) as u32,
        full: KvPair {
            k: kv(2, committed, 16, 0.0, dtype),
            v: kv(2, committed, 16, 0.5, dtype),
        },
        sliding: Some(KvPair {
            k: kv(4, sliding_rows, 8, -100.0, dtype),
            v: kv(4, sliding_rows, 8, -200.0, dtype),
        }),
    }
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

fn assert_same(a: &Tensor, b: &Tensor) {
    assert_eq!(a.dims(), b.dims());
    assert_eq!(a.dtype(), b.dtype());
    assert_eq!(values(a), values(b));
}

fn assemble(chunks: Vec<SnapshotChunk>) -> Result<KvSnapshot, KvWireError> {
    let mut assembler = SnapshotAssembler::new("open.snapshot", 1 << 30);
    for chunk in chunks {
        assembler.push(chunk)?;
    }
    assembler.finish(&CPU)
}

fn data_chunk(part: KvPart, offset: u64, data: Vec<u8>) -> SnapshotChunk {
    SnapshotChunk {
        body: Some(snapshot_chunk::Body::Data(SnapshotData {
            part: part.into(),
            byte_offset: offset,
            data: Bytes::from(data),
        })),
    }
}

fn header_of(chunks: &[SnapshotChunk]) -> SnapshotHeader {
    match &chunks[0].body {
        Some(snapshot_chunk::Body::Header(h)) => h.clone(),
        other => panic!("first chunk is not a header: {other:?}"),
    }
}

#[test]
fn snapshot_round_trips_through_chunks_of_any_size() {
    let original = snapshot(37, 16, DType::BF16);
    // full: 2*37*16*2 = 2368 bytes per tensor; sliding: 4*16*8*2 = 1024 bytes per tensor.
    for chunk_bytes in [1usize, 7, 1000, 1024, 2368, 1 << 20] {
        let chunks = snapshot_chunks(&original, chunk_bytes).unwrap();
        let payload: usize = chunks
            .iter()
            .filter_map(|c| match &c.body {
                Some(snapshot_chunk::Body::Data(d)) => {
                    assert!(!d.data.is_empty() && d.data.len() <= chunk_bytes);
                    Some(d.data.len())
                }
                _ => None,
            })
            .sum();
        assert_eq!(payload, 2 * 2368 + 2 * 1024);

        let back = assemble(chunks).unwrap();
        assert_eq!(back.committed_len, 37);
        assert_eq!(back.sliding_start, 21);
        assert_same(&back.full.k, &original.full.k);
        assert_same(&back.full.v, &original.full.v);
        let (s, o) = (back.sliding.unwrap(), original.sliding.as_ref().unwrap());
        assert_same(&s.k, &o.k);
        assert_same(&s.v, &o.v);
    }
}

#[test]
fn snapshot_header_describes_the_parts() {
    let chunks = snapshot_chunks(&snapshot(5, 3, DType::F32), 64).unwrap();
    let header = header_of(&chunks);
    assert_eq!(header.committed_len, 5);
    assert_eq!(header.sliding_start, 2);
    assert_eq!(
        header.full_k,
        Some(TensorSpec {
            dtype: "f32".into(),
            shape: vec![1, 2, 5, 16]
        })
    );
    assert_eq!(header.sliding_v.unwrap().shape, vec![1, 4, 3, 8]);
    // Data chunks follow in part order with contiguous offsets.
    let order: Vec<(i32, u64)> = chunks[1..]
        .iter()
        .map(|c| match &c.body {
            Some(snapshot_chunk::Body::Data(d)) => (d.part, d.byte_offset),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    let full = 2 * 5 * 16 * 4;
    let expected: Vec<(i32, u64)> = [
        (KvPart::FullK, full),
        (KvPart::FullV, full),
        (KvPart::SlidingK, 384),
        (KvPart::SlidingV, 384),
    ]
    .iter()
    .flat_map(|&(part, len)| (0..len).step_by(64).map(move |o| (part as i32, o as u64)))
    .collect();
    assert_eq!(order, expected);
}

#[test]
fn snapshot_without_sliding_layers_round_trips() {
    let original = KvSnapshot {
        committed_len: 9,
        sliding_start: 0,
        full: KvPair {
            k: kv(2, 9, 4, 0.0, DType::F16),
            v: kv(2, 9, 4, 1.0, DType::F16),
        },
        sliding: None,
    };
    let chunks = snapshot_chunks(&original, 50).unwrap();
    let header = header_of(&chunks);
    assert!(header.sliding_k.is_none() && header.sliding_v.is_none());
    let back = assemble(chunks).unwrap();
    assert!(back.sliding.is_none());
    assert_same(&back.full.v, &original.full.v);
}

#[test]
fn chunk_messages_fit_the_message_limit() {
    let chunk_bytes = 4096;
    let chunks = snapshot_chunks(&snapshot(300, 128, DType::F32), chunk_bytes).unwrap();
    for chunk in chunks {
        // Wrapped the way the router forwards it to a drafter.
        let open = OpenRequest {
            body: Some(open_request::Body::Snapshot(chunk)),
        };
        assert!(open.encoded_len() <= chunk_bytes + CHUNK_ENVELOPE_BYTES);
    }
}

#[test]
fn inconsistent_snapshot_is_refused_by_its_sender() {
    let mut bad = snapshot(10, 4, DType::F32);
    bad.committed_len = 11;
    let err = snapshot_chunks(&bad, 64).unwrap_err();
    assert_eq!(
        err.to_string(),
        "snapshot.header.full_k.shape: expected 11 positions on axis 2, got f32[1,2,10,16]"
    );
    assert!(snapshot_chunks(&snapshot(10, 4, DType::F32), 0).is_err());
}

#[test]
fn data_before_header_is_rejected() {
    let err = assemble(vec![data_chunk(KvPart::FullK, 0, vec![0; 4])]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "open.snapshot[0].data: data before the snapshot header"
    );
}

#[test]
fn second_header_and_empty_chunk_are_rejected() {
    let mut chunks = snapshot_chunks(&snapshot(4, 4, DType::F32), 1 << 20).unwrap();
    let header = chunks[0].clone();
    chunks.insert(2, header);
    let err = assemble(chunks).unwrap_err();
    assert_eq!(
        err.to_string(),
        "open.snapshot[2]: second header in one snapshot"
    );

    let mut assembler = SnapshotAssembler::new("open.snapshot", 1 << 20);
    let err = assembler.push(SnapshotChunk { body: None }).unwrap_err();
    assert_eq!(
        err.to_string(),
        "open.snapshot[0]: chunk has neither header nor data"
    );
}

#[test]
fn parts_out_of_order_are_rejected() {
    let mut chunks = snapshot_chunks(&snapshot(4, 4, DType::F32), 1 << 20).unwrap();
    chunks.swap(1, 2); // full_v before full_k
    let err = assemble(chunks).unwrap_err();
    assert_eq!(
        err.to_string(),
        "open.snapshot[1].data.part: expected full_k, got full_v"
    );

    let mut chunks = snapshot_chunks(&snapshot(4, 4, DType::F32), 1 << 20).unwrap();
    if let Some(snapshot_chunk::Body::Data(d)) = &mut chunks[1].body {
        d.part = 9;
    }
    let err = assemble(chunks).unwrap_err();
    assert_eq!(
        err.to_string(),
        "open.snapshot[1].data.part: unknown part 9"
    );
}

#[test]
fn gaps_and_overlaps_are_rejected() {
    // full_k is 2*4*16*4 = 512 bytes; chunks of 100.
    let mut chunks = snapshot_chunks(&snapshot(4, 4, DType::F32), 100).unwrap();
    chunks.remove(2); // drop bytes 100..200
    let err = assemble(chunks).unwrap_err();
    assert!(matches!(
        err,
        KvWireError::Offset {
            expected: 100,
            got: 200,
            ..
        }
    ));
    assert_eq!(
        err.to_string(),
        "open.snapshot[2].data.byte_offset: expected 100, got 200"
    );

    let mut chunks = snapshot_chunks(&snapshot(4, 4, DType::F32), 100).unwrap();
    let repeat = chunks[1].clone();
    chunks.insert(2, repeat); // bytes 0..100 twice
    let err = assemble(chunks).unwrap_err();
    assert_eq!(
        err.to_string(),
        "open.snapshot[2].data.byte_offset: expected 100, got 0"
    );
}

#[test]
fn overrun_and_empty_ranges_are_rejected() {
    let chunks = snapshot_chunks(&snapshot(4, 4, DType::F32), 1 << 20).unwrap();
    let header = chunks[0].clone();
    let err = assemble(vec![
        header.clone(),
        data_chunk(KvPart::FullK, 0, vec![0; 513]),
    ])
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "open.snapshot[1].data.data: 513 bytes at offset 0 overrun the 512 bytes declared"
    );

    let err = assemble(vec![header, data_chunk(KvPart::FullK, 0, vec![])]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "open.snapshot[1].data.data: empty byte range"
    );
}

#[test]
fn bytes_after_the_last_part_are_rejected() {
    let mut chunks = snapshot_chunks(&snapshot(4, 4, DType::F32), 1 << 20).unwrap();
    chunks.push(data_chunk(KvPart::SlidingV, 512, vec![0; 4]));
    let err = assemble(chunks).unwrap_err();
    assert_eq!(
        err.to_string(),
        "open.snapshot[5].data: every declared byte has already arrived"
    );
}

#[test]
fn truncated_stream_is_incomplete() {
    let mut chunks = snapshot_chunks(&snapshot(4, 4, DType::F32), 100).unwrap();
    chunks.pop();
    let mut assembler = SnapshotAssembler::new("open.snapshot", 1 << 20);
    for chunk in chunks {
        assembler.push(chunk).unwrap();
    }
    assert!(!assembler.is_complete());
    let err = assembler.finish(&CPU).unwrap_err();
    // sliding_v is 4*4*8*4 = 512 bytes; the last 12-byte chunk is missing.
    assert_eq!(
        err.to_string(),
        "open.snapshot: stream ended after 500 of 512 bytes of sliding_v"
    );

    let err = SnapshotAssembler::new("open.snapshot", 1 << 20)
        .finish(&CPU)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "open.snapshot: stream ended before the snapshot header"
    );
}

#[test]
fn oversized_snapshot_is_refused_at_the_header() {
    let chunks = snapshot_chunks(&snapshot(4, 4, DType::F32), 1 << 20).unwrap();
    let mut assembler = SnapshotAssembler::new("open.snapshot", 2047);
    let err = assembler.push(chunks[0].clone()).unwrap_err();
    assert!(matches!(
        err,
        KvWireError::TooLarge {
            declared: 2048,
            limit: 2047,
            ..
        }
    ));
    assert_eq!(err.into_status().code(), tonic::Code::ResourceExhausted);
}

#[test]
fn incoherent_headers_are_rejected() {
    let base = header_of(&snapshot_chunks(&snapshot(6, 4, DType::F32), 1 << 20).unwrap());
    let push = |header: SnapshotHeader| {
        SnapshotAssembler::new("open.snapshot", 1 << 30)
            .push(SnapshotChunk {
                body: Some(snapshot_chunk::Body::Header(header)),
            })
            .unwrap_err()
            .to_string()
    };

    let mut h = base.clone();
    h.committed_len = 7;
    assert_eq!(
        push(h),
        "open.snapshot[0].header.full_k.shape: expected 7 positions on axis 2, got f32[1,2,6,16]"
    );

    let mut h = base.clone();
    h.sliding_start = 3;
    assert_eq!(
        push(h),
        "open.snapshot[0].header.sliding_k.shape: expected 3 positions on axis 2, got f32[1,4,4,8]"
    );

    let mut h = base.clone();
    h.sliding_start = 9;
    assert_eq!(
        push(h),
        "open.snapshot[0].header.sliding_start: 9 is past committed_len 6"
    );

    let mut h = base.clone();
    h.sliding_v = None;
    assert_eq!(
        push(h),
        "open.snapshot[0].header: sliding_k and sliding_v must be both set or both unset"
    );

    let mut h = base.clone();
    h.sliding_k = None;
    h.sliding_v = None;
    assert_eq!(
        push(h),
        "open.snapshot[0].header.sliding_start: must be 0 without sliding tensors, got 2"
    );

    let mut h = base.clone();
    h.full_v = None;
    assert_eq!(
        push(h),
        "open.snapshot[0].header.full_v: required tensor is missing"
    );

    let mut h = base.clone();
    h.full_v.as_mut().unwrap().shape = vec![1, 3, 6, 16];
    assert_eq!(
        push(h),
        "open.snapshot[0].header.full_v.shape: f32[1,3,6,16] does not match full_k f32[1,2,6,16] in batch, heads or positions"
    );

    let mut h = base.clone();
    h.full_k.as_mut().unwrap().shape = vec![2, 6, 16];
    assert_eq!(
        push(h),
        "open.snapshot[0].header.full_k.shape: expected [1,kv_heads,positions,head_dim], got f32[2,6,16]"
    );

    let mut h = base;
    h.full_k.as_mut().unwrap().dtype = "fp8".into();
    assert!(push(h).starts_with("open.snapshot[0].header.full_k.dtype: unknown dtype \"fp8\""));
}

fn delta(rows: usize, with_sliding: bool) -> KvDeltaTensors {
    KvDeltaTensors {
        start_position: 40,
        full: KvPair {
            k: kv(2, rows, 16, 3.0, DType::BF16),
            v: kv(2, rows, 16, 4.0, DType::BF16),
        },
        sliding: with_sliding.then(|| KvPair {
            k: kv(4, rows, 8, 5.0, DType::BF16),
            v: kv(4, rows, 8, 6.0, DType::BF16),
        }),
        sliding_evicted: if with_sliding { rows as u32 } else { 0 },
    }
}

#[test]
fn delta_round_trips() {
    for (rows, sliding) in [(1, true), (4, true), (3, false)] {
        let original = delta(rows, sliding);
        let wire = original.encode("verify.kv_delta").unwrap();
        let back = KvDeltaTensors::decode(&wire, "draft.carry.mtp.delta", &CPU).unwrap();
        assert_eq!(back.rows(), rows);
        assert_eq!(back.start_position, 40);
        assert_eq!(back.sliding_evicted, original.sliding_evicted);
        assert_same(&back.full.k, &original.full.k);
        assert_same(&back.full.v, &original.full.v);
        match (back.sliding, original.sliding) {
            (Some(b), Some(o)) => {
                assert_same(&b.k, &o.k);
                assert_same(&b.v, &o.v);
            }
            (None, None) => {}
            _ => panic!("sliding presence changed"),
        }
    }
}

#[test]
fn delta_size_depends_on_rows_not_context() {
    let wire = delta(4, true).encode("d").unwrap();
    // 4 tensors; full: 2 heads * 16, sliding: 4 heads * 8; bf16; 4 rows.
    let payload = 2 * (2 * 16 * 4 * 2) + 2 * (4 * 8 * 4 * 2);
    assert!(wire.encoded_len() < payload + 128);
}

#[test]
fn malformed_deltas_are_rejected() {
    let good = delta(3, true).encode("d").unwrap();
    let decode = |wire: &KvDelta| {
        KvDeltaTensors::decode(wire, "draft.carry.mtp.delta", &CPU)
            .unwrap_err()
            .to_string()
    };

    let mut w = good.clone();
    w.full_k = None;
    assert_eq!(
        decode(&w),
        "draft.carry.mtp.delta.full_k: required tensor is missing"
    );

    let mut w = good.clone();
    let data = w.full_v.as_ref().unwrap().data.slice(1..);
    w.full_v.as_mut().unwrap().data = data;
    assert_eq!(
        decode(&w),
        "draft.carry.mtp.delta.full_v: expected 192 bytes for bf16[1,2,3,16], got 191"
    );

    let mut w = good.clone();
    w.sliding_k = Some(delta(2, true).encode("d").unwrap().sliding_k.unwrap());
    w.sliding_v = Some(delta(2, true).encode("d").unwrap().sliding_v.unwrap());
    assert_eq!(
        decode(&w),
        "draft.carry.mtp.delta.sliding_k.shape: expected 3 positions on axis 2, got bf16[1,4,2,8]"
    );

    let mut w = good.clone();
    w.sliding_v = None;
    assert_eq!(
        decode(&w),
        "draft.carry.mtp.delta: sliding_k and sliding_v must be both set or both unset"
    );

    let mut w = delta(3, false).encode("d").unwrap();
    w.sliding_evicted = 2;
    assert_eq!(
        decode(&w),
        "draft.carry.mtp.delta.sliding_evicted: must be 0 without sliding tensors, got 2"
    );

    let empty = KvDeltaTensors {
        start_position: 0,
        full: KvPair {
            k: kv(2, 0, 16, 0.0, DType::F32),
            v: kv(2, 0, 16, 0.0, DType::F32),
        },
        sliding: None,
        sliding_evicted: 0,
    };
    let err = empty.encode("verify.kv_delta").unwrap_err();
    assert_eq!(
        err.to_string(),
        "verify.kv_delta.full_k.shape: a round commits at least one position, got 0 rows"
    );

    let mut w = good;
    w.full_k.as_mut().unwrap().dtype = "f33".into();
    let err = KvDeltaTensors::decode(&w, "d", &CPU).unwrap_err();
    assert!(matches!(
        err,
        KvWireError::Tensor(TensorCodecError::UnknownDtype { .. })
    ));
    assert_eq!(err.into_status().code(), tonic::Code::InvalidArgument);
}
