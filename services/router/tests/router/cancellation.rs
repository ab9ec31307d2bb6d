//! Clients that cancel or disconnect leave no verifier sequence and no drafter session.

use std::time::Duration;

use specd_wire::generation::GenerationClient;

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
