//! Without a reachable drafter the router decodes plainly: slower, the same tokens; a
//! drafter that is stopped serves its open sessions first.

use specd_router::DraftSource;
use specd_wire::generation::GenerationClient;

use crate::support::*;

fn request(max_tokens: u32) -> specd_wire::generation::GenerateRequest {
    with_block(
        sampled(ids_request(&PROMPT, max_tokens), 0.9, 21),
        Some(4),
        false,
    )
}

#[tokio::test]
async fn a_drafter_that_never_answers_means_plain_rounds() {
    let verifier = start_verifier(8).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let source = DraftSource::Remote(vec![format!("http://{dead}")]);
    let router = start_router(&verifier, source, &fixture("target-full")).await;
    let mut client = GenerationClient::new(router.channel().await);
    let response = generate(&mut client, request(60)).await.unwrap();
    let plain = generate(&mut client, with_block(request(60), None, true))
        .await
        .unwrap();
    assert_eq!(response.token_ids, plain.token_ids);
    let stats = response.stats.unwrap();
    assert_eq!(stats.drafted, 0);
    assert_eq!(stats.plain_rounds, stats.rounds);
}

#[tokio::test]
async fn a_hybrid_without_a_reachable_drafter_still_looks_up() {
    let verifier = start_verifier(8).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let source = DraftSource::Hybrid {
        urls: vec![format!("http://{dead}")],
        dns: None,
        lookup: specd_core::hybrid::HYBRID_LOOKUP,
    };
    let router = start_router(&verifier, source, &fixture("target-full")).await;
    let mut client = GenerationClient::new(router.channel().await);
    let greedy = |max_tokens| with_block(ids_request(&PROMPT, max_tokens), Some(4), false);
    let response = generate(&mut client, greedy(60)).await.unwrap();
    let plain = generate(
        &mut client,
        with_block(ids_request(&PROMPT, 60), None, true),
    )
    .await
    .unwrap();
    assert_eq!(response.token_ids, plain.token_ids);
    // The fixture's greedy output repeats itself in runs, which lookup alone drafts.
    let stats = response.stats.unwrap();
    assert!(stats.drafted > 0, "{stats:?}");
}

#[tokio::test]
async fn a_drafter_shutting_down_mid_request_drains_it_first() {
    let mut stack = Stack::start(Some(DrafterSetup::RandomMtp)).await;
    let mut client = stack.client().await;
    // Long enough that the request is still running when the drafter is told to stop.
    let plain = generate(&mut client, with_block(request(400), None, true))
        .await
        .unwrap();
    let mut stream = client
        .generate_stream(request(400))
        .await
        .unwrap()
        .into_inner();
    let mut tokens = stream.message().await.unwrap().unwrap().token_ids;
    // The session opens once the first token is out, beside the first rounds.
    while stack.live_sessions().await == 0 {
        tokens.extend(&stream.message().await.unwrap().unwrap().token_ids);
    }
    // Stopping a drafter drains it: its open session is served to the end. (A drafter
    // that dies outright is covered by the CLI failover tests, with real processes.)
    stack.drafter = None;
    let mut last = None;
    while let Some(message) = stream.message().await.unwrap() {
        tokens.extend(&message.token_ids);
        last = Some(message);
    }
    assert_eq!(tokens, plain.token_ids);
    let stats = last.unwrap().stats.unwrap();
    assert!(stats.drafted > 0);
    assert_eq!(stats.drafter_resyncs, 0);
    assert_eq!(stack.live_sequences().await, 0);
}
