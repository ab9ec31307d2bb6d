//! The per-round K/V deltas rebuild exactly the snapshot the verifier holds, and their size
//! depends on the round, never on the context.

use candle_core::{Device, Tensor};
use specd_wire::kv::{KvDeltaTensors, KvPair, KvSnapshot, SnapshotAssembler};
use specd_wire::verifier::SnapshotRequest;
use specd_wire::SnapshotChunk;

use crate::support::*;

fn assemble(chunks: Vec<SnapshotChunk>) -> KvSnapshot {
    let mut assembler = SnapshotAssembler::new("snapshot", usize::MAX);
    for chunk in chunks {
        assembler.push(chunk).unwrap();
    }
    assembler.finish(&Device::Cpu).unwrap()
}

fn cat(held: &KvPair, rows: &KvPair) -> KvPair {
    KvPair {
        k: Tensor::cat(&[&held.k, &rows.k], 2).unwrap(),
        v: Tensor::cat(&[&held.v, &rows.v], 2).unwrap(),
    }
}

fn drop_front(pair: &KvPair, n: usize) -> KvPair {
    let rows = pair.k.dims()[2];
    KvPair {
        k: pair.k.narrow(2, n, rows - n).unwrap(),
        v: pair.v.narrow(2, n, rows - n).unwrap(),
    }
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

fn assert_same(a: &KvPair, b: &KvPair, what: &str) {
    assert_eq!(a.k.dims(), b.k.dims(), "{what} keys");
    assert_eq!(values(&a.k), values(&b.k), "{what} keys");
    assert_eq!(values(&a.v), values(&b.v), "{what} values");
}

#[tokio::test]
async fn deltas_rebuild_the_verifier_snapshot() {
    let server = TestVerifier::start().await;
    let mut client = server.client().await;
    let out = prefill(&mut client, prefill_request(&PROMPT, true))
        .await
        .unwrap();
    let head = out.head;
    let mut mirror = assemble(out.snapshot);
    let mut emitted = 1u32;
    let mut bonus = head.first_token;
    let mut committed = head.committed_len;
    // Drafts are arbitrary ids, so most rounds reject early and roll back; the block sizes
    // vary so rollback, eviction and acceptance all move.
    for round in 1..=24u64 {
        let drafts = (round % 5) as usize;
        let mut tokens = vec![bonus];
        tokens.extend((0..drafts).map(|i| ((round * 31 + i as u64 * 7) % 256) as u32));
        let request = verify_request(&head.seq_id, round, &tokens, emitted, committed);
        let answer = verify(&mut client, request).await.unwrap();
        let delta =
            KvDeltaTensors::decode(answer.kv_delta.as_ref().unwrap(), "d", &Device::Cpu).unwrap();
        assert_eq!(delta.start_position, committed);
        assert_eq!(delta.rows(), answer.accepted as usize + 1);
        mirror.full = cat(&mirror.full, &delta.full);
        let sliding = cat(
            mirror.sliding.as_ref().unwrap(),
            delta.sliding.as_ref().unwrap(),
        );
        mirror.sliding = Some(drop_front(&sliding, delta.sliding_evicted as usize));
        mirror.sliding_start += delta.sliding_evicted;
        mirror.committed_len = answer.committed_len;
        committed = answer.committed_len;
        emitted += answer.new_tokens.len() as u32;
        bonus = *answer.new_tokens.last().unwrap();
    }
    assert!(committed as usize >= PROMPT.len() + 24);

    let chunks: Vec<SnapshotChunk> = {
        let mut stream = client
            .snapshot(SnapshotRequest {
                seq_id: head.seq_id.clone(),
                max_chunk_bytes: 256,
            })
            .await
            .unwrap()
            .into_inner();
        let mut chunks = Vec::new();
        while let Some(chunk) = stream.message().await.unwrap() {
            chunks.push(chunk);
        }
        chunks
    };
    let held = assemble(chunks);
    assert_eq!(held.committed_len, committed);
    assert_eq!(held.sliding_start, mirror.sliding_start);
    assert!(
        held.sliding_start > 0,
        "the window must have moved for this test to bite"
    );
    assert_same(&mirror.full, &held.full, "full");
    assert_same(
        mirror.sliding.as_ref().unwrap(),
        held.sliding.as_ref().unwrap(),
        "sliding",
    );
}
