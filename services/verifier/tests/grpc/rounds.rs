//! Verify rounds: plain decoding equals the local verifier, retries replay, order is enforced.

use specd_core::{
    BlockSizeConfig, Detokenizer, Event, GenerationRequest, RequestControl, RoundLoop,
    SamplingParams, SeqId, SessionId, StopConditions,
};
use specd_verifier::{LocalVerifier, VerifierLimits};
use tonic::Code;

use crate::support::*;

struct NoText;

impl Detokenizer for NoText {
    fn decode(&self, _ids: &[u32]) -> Result<String, specd_core::stop::DetokenizeError> {
        Ok(String::new())
    }
}

/// Tokens of a plain in-process decode of PROMPT.
async fn local_plain(max_tokens: usize) -> Vec<u32> {
    let local = LocalVerifier::new(load_target("target-full"), VerifierLimits::default());
    let request = GenerationRequest {
        seq: SeqId(1),
        session: SessionId(1),
        prompt_ids: PROMPT.to_vec(),
        sampling: SamplingParams::GREEDY,
        stop: StopConditions::max_tokens(max_tokens),
        block_size: BlockSizeConfig::PLAIN,
        cache_scope: Default::default(),
        forced_drafts: 0,
        rules: Default::default(),
        top_logprobs: None,
    };
    let mut events = Vec::new();
    RoundLoop::plain(&local, &NoText)
        .run(request, &mut events, &RequestControl::new())
        .await
        .unwrap();
    events
        .into_iter()
        .filter_map(|e| match e {
            Event::Tokens(delta) => Some(delta.tokens),
            Event::Finished(_) => None,
        })
        .flatten()
        .collect()
}

#[tokio::test]
async fn plain_rounds_reproduce_local_decoding() {
    let server = TestVerifier::start().await;
    let mut client = server.client().await;
    let head = prefill(&mut client, prefill_request(&PROMPT, false))
        .await
        .unwrap()
        .head;
    let mut tokens = vec![head.first_token];
    let mut committed = head.committed_len;
    for round in 1..20u64 {
        let bonus = *tokens.last().unwrap();
        let request = verify_request(
            &head.seq_id,
            round,
            &[bonus],
            tokens.len() as u32,
            committed,
        );
        let answer = verify(&mut client, request).await.unwrap();
        assert_eq!(answer.accepted, 0);
        assert_eq!(answer.committed_len, committed + 1);
        assert!(!answer.replayed);
        committed = answer.committed_len;
        tokens.extend(answer.new_tokens);
    }
    assert_eq!(tokens, local_plain(20).await);
}

#[tokio::test]
async fn drafts_from_the_target_are_accepted_and_cut_to_the_budget() {
    let expected = local_plain(8).await;
    let server = TestVerifier::start().await;
    let mut client = server.client().await;
    let head = prefill(&mut client, prefill_request(&PROMPT, false))
        .await
        .unwrap()
        .head;
    // Block [t0, t1, t2, t3] drafts exactly the target's next tokens: all accepted.
    let request = verify_request(&head.seq_id, 1, &expected[..4], 1, head.committed_len);
    let answer = verify(&mut client, request).await.unwrap();
    assert_eq!(answer.accepted, 3);
    assert_eq!(answer.new_tokens, expected[1..5]);
    // The forward it ran in: this sequence's row alone.
    let forward = answer.forward.expect("forward stats");
    assert_eq!((forward.tokens, forward.rows), (4, 1));
    assert!(forward.micros > 0);
    assert_eq!(answer.committed_len, head.committed_len + 4);
    // A wrong second draft stops the walk there; the budget cuts what is emitted.
    let bonus = expected[4];
    let mut request = verify_request(
        &head.seq_id,
        2,
        &[bonus, expected[5], (expected[6] + 1) % 256, 9],
        5,
        answer.committed_len,
    );
    request.budget = 1;
    let cut = verify(&mut client, request).await.unwrap();
    assert_eq!(cut.accepted, 1);
    assert_eq!(cut.new_tokens, expected[5..6]);
    assert_eq!(cut.committed_len, answer.committed_len + 2);
}

#[tokio::test]
async fn a_retried_round_replays_and_changes_nothing() {
    let server = TestVerifier::start().await;
    let mut client = server.client().await;
    let head = prefill(&mut client, prefill_request(&PROMPT, true))
        .await
        .unwrap()
        .head;
    let first = verify_request(
        &head.seq_id,
        1,
        &[head.first_token, 5, 6],
        1,
        head.committed_len,
    );
    let answer = verify(&mut client, first.clone()).await.unwrap();
    let again = verify(&mut client, first.clone()).await.unwrap();
    assert!(again.replayed);
    assert!(answer.forward.is_some());
    assert_eq!(again.forward, None, "a replay runs no forward");
    assert_eq!(again.accepted, answer.accepted);
    assert_eq!(again.new_tokens, answer.new_tokens);
    assert_eq!(again.committed_len, answer.committed_len);
    assert_eq!(again.hidden, answer.hidden);
    assert_eq!(again.kv_delta, answer.kv_delta);

    // A retry with other tokens, a skipped round and a stale length are refused.
    let mut other = first.clone();
    other.tokens = vec![head.first_token, 7];
    let err = verify(&mut client, other).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("tokens"), "{err}");
    let bonus = *answer.new_tokens.last().unwrap();
    let skipped = verify_request(&head.seq_id, 3, &[bonus], 2, answer.committed_len);
    let err = verify(&mut client, skipped).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("round"), "{err}");
    let stale = verify_request(&head.seq_id, 2, &[bonus], 2, head.committed_len);
    let err = verify(&mut client, stale).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("committed_len"), "{err}");

    // The sequence is unchanged: the next round continues normally.
    let next = verify_request(&head.seq_id, 2, &[bonus], 2, answer.committed_len);
    let answer2 = verify(&mut client, next).await.unwrap();
    assert_eq!(answer2.committed_len, answer.committed_len + 1);
}
