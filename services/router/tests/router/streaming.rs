//! GenerateStream: its messages add up to Generate's answer, the last one carries the stats.

use specd_wire::generation::FinishReason;

use crate::support::*;

#[tokio::test]
async fn stream_messages_concatenate_to_the_unary_answer() {
    // Rounds run plain while a remote drafter's session opens, so with one the drafted
    // count would depend on how long each open took. The router's prompt lookup opens at
    // once, so both requests draft alike and their stats can be compared.
    let stack = Stack::start(Some(DrafterSetup::Ngram)).await;
    let mut client = stack.client().await;
    let request = with_block(sampled(ids_request(&PROMPT, 30), 0.8, 5), Some(4), false);
    let unary = generate(&mut client, request.clone()).await.unwrap();

    let mut stream = client.generate_stream(request).await.unwrap().into_inner();
    let mut messages = Vec::new();
    while let Some(message) = stream.message().await.unwrap() {
        messages.push(message);
    }
    let (last, steps) = messages.split_last().unwrap();
    assert!(steps.len() > 1, "tokens arrive over several messages");
    for step in steps {
        assert_eq!(step.finish_reason(), FinishReason::Unspecified);
        assert!(step.stats.is_none());
    }
    let tokens: Vec<u32> = messages.iter().flat_map(|m| m.token_ids.clone()).collect();
    assert_eq!(tokens, unary.token_ids);
    assert_eq!(last.finish_reason(), FinishReason::Length);
    let stats = last.stats.as_ref().unwrap();
    let unary_stats = unary.stats.unwrap();
    assert_eq!(stats.completion_tokens, 30);
    assert_eq!(stats.rounds, unary_stats.rounds);
    assert_eq!(stats.drafted, unary_stats.drafted);
    assert!(stats.drafted > 0, "the lookup drafted");
    assert_eq!(stats.seed, 5);
    assert!(stats.total_time_ms >= stats.time_to_first_token_ms);
}

#[tokio::test]
async fn default_max_tokens_and_eos_finish() {
    let stack = Stack::start(None).await;
    let mut client = stack.client().await;
    // max_tokens unset: the router's default (24 in these tests).
    let mut request = ids_request(&PROMPT, 1);
    request.max_tokens = None;
    let response = generate(&mut client, request).await.unwrap();
    assert_eq!(response.token_ids.len(), 24);
    // Without ignore_eos, the target's EOS id (1) ends generation as soon as it is drawn.
    let mut request = ids_request(&PROMPT, 200);
    request.ignore_eos = false;
    let response = generate(&mut client, request).await.unwrap();
    match response.token_ids.iter().position(|&t| t == 1) {
        Some(at) => {
            assert_eq!(at + 1, response.token_ids.len());
            assert_eq!(response.finish_reason(), FinishReason::Eos);
        }
        None => assert_eq!(response.finish_reason(), FinishReason::Length),
    }
}
