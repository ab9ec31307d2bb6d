//! Prefill: the head, the chunked snapshot and what they hold.

use candle_core::Device;
use specd_wire::kv::SnapshotAssembler;
use specd_wire::snapshot_chunk;
use specd_wire::tensor::decode;

use crate::support::*;

#[tokio::test]
async fn plain_prefill_answers_the_head_only() {
    let server = TestVerifier::start().await;
    let mut client = server.client().await;
    let out = prefill(&mut client, prefill_request(&PROMPT, false))
        .await
        .unwrap();
    assert_eq!(out.head.committed_len, PROMPT.len() as u32);
    assert!(out.head.first_token < 256);
    assert!(out.head.hidden.is_none());
    assert!(out.snapshot.is_empty());
    assert_eq!(live_sequences(&mut client).await, 1);
}

#[tokio::test]
async fn mtp_prefill_streams_hidden_and_snapshot_in_small_chunks() {
    let server = TestVerifier::start().await;
    let mut client = server.client().await;
    let mut request = prefill_request(&PROMPT, true);
    request.max_chunk_bytes = 100;
    let out = prefill(&mut client, request).await.unwrap();

    let hidden = decode(out.head.hidden.as_ref().unwrap(), "hidden", &Device::Cpu).unwrap();
    assert_eq!(hidden.dims(), [1, 1, 64]);
    // Every chunk respects the asked size, and the stream reassembles.
    let mut assembler = SnapshotAssembler::new("snapshot", usize::MAX);
    for chunk in out.snapshot {
        if let Some(snapshot_chunk::Body::Data(data)) = &chunk.body {
            assert!(!data.data.is_empty() && data.data.len() <= 100);
        }
        assembler.push(chunk).unwrap();
    }
    let snapshot = assembler.finish(&Device::Cpu).unwrap();
    assert_eq!(snapshot.committed_len, PROMPT.len() as u32);
    // The last full layer has one KV head of size 32; sliding layers two of 16.
    assert_eq!(snapshot.full.k.dims(), [1, 1, PROMPT.len(), 32]);
    let sliding = snapshot.sliding.unwrap();
    let rows = PROMPT.len() - snapshot.sliding_start as usize;
    assert_eq!(sliding.k.dims(), [1, 2, rows, 16]);
}

#[tokio::test]
async fn the_first_token_is_the_target_choice() {
    // The head's token equals a plain local decode's first token, greedy and seeded.
    let server = TestVerifier::start().await;
    let mut client = server.client().await;
    let local = specd_verifier::LocalVerifier::new(load_target("target-full"), Default::default());
    for (temperature, seed) in [(0.0, 0), (0.9, 11), (0.9, 12)] {
        let sampling = specd_core::SamplingParams {
            temperature,
            top_p: 1.0,
            top_k: 0,
            seed,
        };
        let mut request = prefill_request(&PROMPT, false);
        request.sampling = Some(specd_wire::Sampling {
            temperature,
            top_p: 1.0,
            top_k: 0,
            seed,
        });
        let remote = prefill(&mut client, request)
            .await
            .unwrap()
            .head
            .first_token;
        let expected = local
            .prefill_sync(specd_core::PrefillRequest {
                seq: specd_core::SeqId(seed + 100),
                prompt_ids: PROMPT.to_vec(),
                sampling,
                want_carry: false,
                cache_scope: Default::default(),
                rules: Default::default(),
                top_logprobs: None,
                mask: None,
                emitted_in_prompt: 0,
            })
            .unwrap()
            .first_token;
        assert_eq!(remote, expected, "temperature {temperature} seed {seed}");
    }
}
