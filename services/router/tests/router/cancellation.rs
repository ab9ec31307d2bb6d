//! Clients that cancel or disconnect leave no verifier sequence and no drafter session.

use std::time::Duration;

use specd_router::{DraftSource, RouterConfig};
use specd_wire::generation::GenerationClient;
use tonic::Code;

use crate::support::*;

async fn abandon_streams(stack: &Stack, count: usize) {
    for i in 0..count {
        // Separate connections, so some clients can vanish with theirs.
        let channel = stack.router.channel().await;
        let mut client = GenerationClient::new(channel.clone());
        let request = with_block(ids_request(&PROMPT, 900), Some(4), false);
        let mut stream = client.generate_stream(request).await.unwrap().into_inner();
        if i % 2 == 0 {
            // Take the first tokens, so the request is surely mid-flight.
            assert!(!stream
                .message()
                .await
                .unwrap()
                .unwrap()
                .token_ids
                .is_empty());
        }
        if i % 3 == 0 {
            drop(channel);
            drop(client);
        }
        drop(stream);
    }
}

async fn abandon_unary(stack: &Stack, count: usize) {
    let mut cut_short = 0;
    for _ in 0..count {
        let mut client = stack.client().await;
        let request = with_block(ids_request(&PROMPT, 990), Some(4), false);
        let call = client.generate(request);
        // The client gives up long before ~990 rounds can have run.
        if tokio::time::timeout(Duration::from_millis(5), call)
            .await
            .is_err()
        {
            cut_short += 1;
        }
    }
    assert!(
        cut_short > 0,
        "no unary request was still running when its client gave up"
    );
}

#[tokio::test]
async fn cancelled_requests_free_sequences_and_sessions_remote_drafter() {
    let stack = Stack::start(Some(DrafterSetup::RandomMtp)).await;
    abandon_streams(&stack, 6).await;
    abandon_unary(&stack, 3).await;
    assert!(
        stack.drained().await,
        "left behind: {} sequences, {} sessions",
        stack.live_sequences().await,
        stack.live_sessions().await
    );
}

#[tokio::test]
async fn cancelled_requests_free_sequences_and_sessions_mtp_drafter() {
    let stack = Stack::start(Some(DrafterSetup::Mtp)).await;
    abandon_streams(&stack, 4).await;
    abandon_unary(&stack, 2).await;
    assert!(
        stack.drained().await,
        "left behind: {} sequences, {} sessions",
        stack.live_sequences().await,
        stack.live_sessions().await
    );
}

#[tokio::test]
async fn cancelled_requests_free_sequences_ngram() {
    let stack = Stack::start(Some(DrafterSetup::Ngram)).await;
    abandon_streams(&stack, 4).await;
    abandon_unary(&stack, 2).await;
    assert!(stack.drained().await);
    // The router still serves afterwards.
    let mut client = stack.client().await;
    let response = generate(&mut client, ids_request(&PROMPT, 5))
        .await
        .unwrap();
    assert_eq!(response.token_ids.len(), 5);
}

#[tokio::test]
async fn a_hundred_abandoned_requests_leave_nothing_behind() {
    let stack = Stack::start(Some(DrafterSetup::RandomMtp)).await;
    abandon_streams(&stack, 80).await;
    abandon_unary(&stack, 20).await;
    assert!(
        stack.drained().await,
        "left behind: {} sequences, {} sessions",
        stack.live_sequences().await,
        stack.live_sessions().await
    );
}

/// A request carrying `timeout` as its grpc-timeout.
fn with_timeout<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

#[tokio::test]
async fn an_expired_deadline_ends_the_request_and_frees_it() {
    let stack = Stack::start(Some(DrafterSetup::RandomMtp)).await;
    let mut client = stack.client().await;
    // Far more rounds than fit in the deadline.
    let long = || with_block(ids_request(&PROMPT, 990), Some(4), false);

    let status = client
        .generate(with_timeout(long(), Duration::from_millis(200)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");

    let mut stream = client
        .generate_stream(with_timeout(long(), Duration::from_millis(200)))
        .await
        .unwrap()
        .into_inner();
    let status = loop {
        match stream.message().await {
            Ok(Some(message)) => assert!(message.stats.is_none(), "finished in time"),
            Ok(None) => panic!("stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
    assert!(stack.drained().await);

    // A deadline that leaves room changes nothing.
    let response = client
        .generate(with_timeout(
            with_block(ids_request(&PROMPT, 5), Some(4), false),
            Duration::from_secs(60),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.token_ids.len(), 5);
}

#[tokio::test]
async fn requests_beyond_capacity_are_refused_at_once() {
    let verifier = start_verifier(64).await;
    let config = RouterConfig {
        max_concurrent_requests: 1,
        ..RouterConfig::default()
    };
    let router = start_router_with(
        &verifier,
        DraftSource::None,
        &fixture("target-full"),
        config,
    )
    .await;
    let mut client = GenerationClient::new(router.channel().await);
    let mut running = client
        .generate_stream(ids_request(&PROMPT, 990))
        .await
        .unwrap()
        .into_inner();
    assert!(running.message().await.unwrap().is_some());

    let refused = generate(&mut client, ids_request(&PROMPT, 5))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("max_concurrent_requests"),
        "{refused}"
    );

    drop(running);
    // The place frees once the dropped stream's request has been torn down.
    let mut answered = None;
    for _ in 0..200 {
        match generate(&mut client, ids_request(&PROMPT, 5)).await {
            Err(status) if status.code() == Code::ResourceExhausted => {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            other => {
                answered = Some(other);
                break;
            }
        }
    }
    assert_eq!(answered.unwrap().unwrap().token_ids.len(), 5);
}
