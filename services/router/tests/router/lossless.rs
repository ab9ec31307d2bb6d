//! Speculative output equals plain target output token for token, whatever the drafter and
//! block size, greedy and seeded; and plain decoding through the services equals embedded
//! decoding.

use std::sync::Arc;

use candle_core::{DType, Device};
use specd_core::{
    BlockSizeConfig, Event, GenerationRequest, RequestControl, RoundLoop, SamplingParams, SeqId,
    SessionId, StopConditions,
};
use specd_router::TargetText;
use specd_verifier::{Gemma4Target, LocalVerifier, VerifierLimits};
use specd_wire::generation::FinishReason;

use crate::support::*;

const MAX_TOKENS: u32 = 40;
/// Greedy, then temperatures 0.7 to 1.0 with distinct seeds.
const SAMPLINGS: [(f32, u64); 4] = [(0.0, 0), (0.7, 11), (0.9, 12), (1.0, 13)];

fn request(temperature: f32, seed: u64) -> specd_wire::generation::GenerateRequest {
    sampled(ids_request(&PROMPT, MAX_TOKENS), temperature, seed)
}

/// The same request decoded in this process: LocalVerifier and the plain round loop.
async fn embedded(temperature: f32, seed: u64) -> Vec<u32> {
    let target = Gemma4Target::load(&fixture("target-full"), DType::F32, &Device::Cpu).unwrap();
    let verifier = LocalVerifier::new(Arc::new(target), VerifierLimits::default());
    let request = GenerationRequest {
        seq: SeqId(1),
        session: SessionId(1),
        prompt_ids: PROMPT.to_vec(),
        sampling: SamplingParams {
            temperature,
            top_p: 1.0,
            top_k: 0,
            seed,
        },
        stop: StopConditions {
            ignore_eos: true,
            ..StopConditions::max_tokens(MAX_TOKENS as usize)
        },
        block_size: BlockSizeConfig::PLAIN,
        cache_scope: Default::default(),
        forced_drafts: 0,
        rules: Default::default(),
        top_logprobs: None,
    };
    let text = TargetText::without_tokenizer(Vec::new());
    let mut events = Vec::new();
    RoundLoop::plain(&verifier, &text)
        .run(request, &mut events, &RequestControl::new())
        .await
        .unwrap();
    events
        .into_iter()
        .flat_map(|event| match event {
            Event::Tokens(delta) => delta.tokens,
            Event::Finished(_) => Vec::new(),
        })
        .collect()
}

#[tokio::test]
async fn plain_decoding_through_the_services_equals_embedded_decoding() {
    let stack = Stack::start(None).await;
    let mut client = stack.client().await;
    for (temperature, seed) in SAMPLINGS {
        let response = generate(&mut client, request(temperature, seed))
            .await
            .unwrap();
        assert_eq!(
            response.token_ids,
            embedded(temperature, seed).await,
            "temperature {temperature} seed {seed}"
        );
        let stats = response.stats.unwrap();
        assert_eq!(stats.drafted, 0);
        assert_eq!(stats.plain_rounds, stats.rounds);
        assert_eq!(stats.seed, seed);
    }
}

/// Runs every sampling with block sizes 2..=8 and the adaptive policy; each output must be
/// the plain output. Returns the drafts accepted over all runs.
async fn assert_lossless(setup: DrafterSetup) -> (u32, u32) {
    let stack = Stack::start(Some(setup)).await;
    let mut client = stack.client().await;
    let (mut drafted, mut accepted) = (0, 0);
    for (temperature, seed) in SAMPLINGS {
        let plain = generate(
            &mut client,
            with_block(request(temperature, seed), None, true),
        )
        .await
        .unwrap();
        assert_eq!(plain.stats.as_ref().unwrap().drafted, 0);
        let blocks = (2..=8).map(Some).chain([None]);
        for block_size in blocks {
            let response = generate(
                &mut client,
                with_block(request(temperature, seed), block_size, false),
            )
            .await
            .unwrap();
            let what =
                format!("{setup:?} block {block_size:?} temperature {temperature} seed {seed}");
            assert_eq!(response.token_ids, plain.token_ids, "{what}");
            assert_eq!(response.finish_reason(), FinishReason::Length, "{what}");
            let stats = response.stats.unwrap();
            assert_eq!(stats.completion_tokens, MAX_TOKENS, "{what}");
            assert_eq!(
                stats.accepted_per_position.iter().sum::<u32>(),
                stats.accepted
            );
            assert!(stats.accepted <= stats.drafted, "{what}");
            assert!(stats.mean_accepted_tokens_per_round >= 1.0, "{what}");
            drafted += stats.drafted;
            accepted += stats.accepted;
        }
    }
    assert!(
        stack.drained().await,
        "{setup:?}: sequences or sessions left behind"
    );
    (drafted, accepted)
}

#[tokio::test]
async fn ngram_speculation_is_lossless() {
    let (drafted, accepted) = assert_lossless(DrafterSetup::Ngram).await;
    assert!(
        drafted > 0,
        "the repetitive prompt must give prompt lookup something"
    );
    // Accepted drafts exercise the multi-token commit path, not only rejections.
    assert!(accepted > 0);
}

#[tokio::test]
async fn mtp_speculation_is_lossless() {
    let (drafted, accepted) = assert_lossless(DrafterSetup::Mtp).await;
    assert!(drafted > 0);
    assert!(
        accepted > 0,
        "the assistant fixture agrees with its target now and then"
    );
}

#[tokio::test]
async fn random_drafts_over_the_mtp_protocol_are_lossless() {
    let (drafted, _) = assert_lossless(DrafterSetup::RandomMtp).await;
    assert!(drafted > 0);
}

#[tokio::test]
async fn random_drafts_over_the_draft_model_protocol_are_lossless() {
    let (drafted, _) = assert_lossless(DrafterSetup::RandomDraftModel).await;
    assert!(drafted > 0);
}

#[tokio::test]
async fn hybrid_speculation_over_mtp_is_lossless() {
    // Lookup rounds on the repetitive prompt leave the MTP session behind; the K/V rows of
    // those rounds reach it merged with its next draft call.
    let (drafted, accepted) = assert_lossless(DrafterSetup::HybridMtp).await;
    assert!(drafted > 0);
    assert!(accepted > 0);
}

#[tokio::test]
async fn hybrid_speculation_over_the_draft_model_protocol_is_lossless() {
    let (drafted, accepted) = assert_lossless(DrafterSetup::HybridRandomDraftModel).await;
    assert!(drafted > 0);
    // Random drafts are rarely right; the lookup's are, on this prompt.
    assert!(accepted > 0);
}
