//! Truncate, Release, Stats, expiry, health, and streams abandoned by their clients.

use std::time::Duration;

use specd_wire::verifier::{ReleaseRequest, TruncateRequest, VerifierClient, VerifierStatsRequest};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::support::*;

#[tokio::test]
async fn truncate_rolls_back_and_release_frees() {
    let server = TestVerifier::start().await;
    let mut client = server.client().await;
    let head = prefill(&mut client, prefill_request(&PROMPT, false))
        .await
        .unwrap()
        .head;
    let seq = head.seq_id;
    let first = verify(
        &mut client,
        verify_request(&seq, 1, &[head.first_token], 1, head.committed_len),
    )
    .await
    .unwrap();
    let bonus = first.new_tokens[0];
    let second = verify(
        &mut client,
        verify_request(&seq, 2, &[bonus], 2, first.committed_len),
    )
    .await
    .unwrap();

    // Back to the length after round 1; round 3 then redoes round 2 identically.
    let truncated = client
        .truncate(TruncateRequest {
            seq_id: seq.clone(),
            committed_len: first.committed_len,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(truncated.committed_len, first.committed_len);
    let redo = verify(
        &mut client,
        verify_request(&seq, 3, &[bonus], 2, first.committed_len),
    )
    .await
    .unwrap();
    assert_eq!(redo.new_tokens, second.new_tokens);

    let err = client
        .truncate(TruncateRequest {
            seq_id: seq.clone(),
            committed_len: redo.committed_len + 1,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err}");
    assert!(err.message().contains("committed_len"), "{err}");

    let release = |client: &mut VerifierClient<_>| {
        let mut client = client.clone();
        let seq_id = seq.clone();
        async move {
            client
                .release(ReleaseRequest { seq_id })
                .await
                .unwrap()
                .into_inner()
                .released
        }
    };
    assert!(release(&mut client).await);
    assert!(!release(&mut client).await, "release is idempotent");
    let err = verify(
        &mut client,
        verify_request(&seq, 4, &[bonus], 3, redo.committed_len),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    assert_eq!(live_sequences(&mut client).await, 0);
}

#[tokio::test]
async fn stats_report_the_target_and_occupancy() {
    let server = TestVerifier::start().await;
    let mut client = server.client().await;
    let idle = client
        .stats(VerifierStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(idle.live_sequences, 0);
    assert_eq!(idle.kv_bytes, 0);
    assert_eq!(idle.vocab_size, 256);
    assert_eq!(idle.max_context_tokens, 1024);
    assert_eq!(idle.max_block_size, 17);
    assert_eq!(idle.max_sequences, 64);
    assert_eq!(idle.model, "target-full");
    prefill(&mut client, prefill_request(&PROMPT, false))
        .await
        .unwrap();
    let busy = client
        .stats(VerifierStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(busy.live_sequences, 1);
    assert!(busy.kv_bytes > 0);
}

#[tokio::test]
async fn abandoned_prefill_streams_release_their_sequences() {
    let server = TestVerifier::start().await;
    let mut admin = server.client().await;
    let long_prompt: Vec<u32> = (0..200).map(|i| (i * 7 % 250) as u32 + 3).collect();
    for round in 0..6 {
        // A dedicated connection per stream, so some rounds can drop the whole connection.
        let channel = server.channel().await;
        let mut client = VerifierClient::new(channel.clone());
        let mut request = prefill_request(&long_prompt, true);
        // One-byte chunks: the stream is far longer than any transport buffer.
        request.max_chunk_bytes = 1;
        let mut stream = client.prefill(request).await.unwrap().into_inner();
        if round % 2 == 0 {
            // Read the head (so the sequence exists), then walk away.
            let head = stream.message().await.unwrap().unwrap();
            assert!(head.body.is_some());
        }
        if round % 3 == 0 {
            drop(channel);
            drop(client);
        }
        drop(stream);
    }
    // Cancelled before any answer: the call future itself is dropped.
    for _ in 0..3 {
        let mut client = server.client().await;
        let call = client.prefill(prefill_request(&long_prompt, true));
        let _ = tokio::time::timeout(Duration::from_millis(1), call).await;
    }
    assert!(
        drained(&mut admin).await,
        "abandoned prefills leaked sequences"
    );
}

#[tokio::test]
async fn idle_sequences_expire() {
    let server = TestVerifier::start_with(Options {
        idle_timeout: Some(Duration::from_millis(100)),
        ..Options::default()
    })
    .await;
    let mut client = server.client().await;
    let head = prefill(&mut client, prefill_request(&PROMPT, false))
        .await
        .unwrap()
        .head;
    assert!(
        drained(&mut client).await,
        "the idle sequence did not expire"
    );
    let err = verify(
        &mut client,
        verify_request(&head.seq_id, 1, &[head.first_token], 1, head.committed_len),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
}

#[tokio::test]
async fn health_reports_serving() {
    let server = TestVerifier::start().await;
    let mut health = HealthClient::new(server.channel().await);
    for service in ["", "specd.v1.Verifier"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status();
        assert_eq!(status, ServingStatus::Serving, "{service:?}");
    }
}
