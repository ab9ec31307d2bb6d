//! Property: whatever a drafter proposes and whatever block sizes a request runs with, the
//! round loop emits exactly what plain decoding emits, and its statistics add up.
//!
//! The drafter here is random per position: the target's own token, a wrong token of the
//! vocabulary, or an id outside it; it may draft fewer tokens than asked, and it may
//! misbehave (fail to open, fail a draft, answer with too many tokens), which must only
//! switch the request to plain decoding.

use std::collections::HashMap;
use std::sync::Mutex;

use proptest::prelude::*;
use specd_core::sampling::mix64;
use specd_core::{
    BlockSizeConfig, DraftRequest, Drafter, Finish, GenerationRequest, OpenRequest, Opened,
    RoundLoop, SamplingParams, SessionId, StopConditions,
};

use crate::support::executor::block_on;
use crate::support::pieces::Pieces;
use crate::support::scenario::{finished_event, text_of, tokens_of, SEQ, SESSION};
use crate::support::table_target::{reference_decode, target_token, VOCAB};
use crate::support::table_verifier::{Carry, TableVerifier};

/// The router's default ceiling on the block size.
const MAX_BLOCK: usize = 8;
const MAX_TOKENS: usize = 48;

/// How the drafter breaks its contract, if it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Misbehaviour {
    None,
    FailOpen,
    FailDraftAt(u32),
    TooManyAt(u32),
}

#[derive(Clone, Copy, Debug)]
struct DraftPolicy {
    seed: u64,
    /// Percent of positions that get the target's own token.
    right_percent: u64,
    /// Percent of the other positions that get an id outside the vocabulary.
    out_of_range_percent: u64,
    /// Sometimes draft fewer tokens than asked.
    short: bool,
    misbehaviour: Misbehaviour,
    /// The loop knows the vocabulary size, so it refuses out-of-range drafts itself instead
    /// of sending them to the verifier.
    vocab_checked: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("random drafter: {0}")]
struct RandomDrafterError(String);

/// A drafter that mirrors the committed sequence, so it knows the target's next tokens, and
/// decides per position by a keyed hash whether to propose them.
struct RandomDrafter {
    policy: DraftPolicy,
    mirrors: Mutex<HashMap<SessionId, (Vec<u32>, SamplingParams)>>,
}

impl RandomDrafter {
    fn new(policy: DraftPolicy) -> Self {
        Self {
            policy,
            mirrors: Mutex::default(),
        }
    }

    fn draft_now(&self, request: DraftRequest<Carry>) -> Result<Vec<u32>, RandomDrafterError> {
        let p = self.policy;
        if p.misbehaviour == Misbehaviour::FailDraftAt(request.round) {
            return Err(RandomDrafterError("injected draft failure".into()));
        }
        let mut mirrors = self.mirrors.lock().unwrap();
        let (context, sampling) = mirrors
            .get_mut(&request.session)
            .ok_or_else(|| RandomDrafterError(format!("unknown {}", request.session)))?;
        context.extend_from_slice(&request.committed_tokens);
        assert_eq!(context.len(), request.committed_len, "mirror out of step");

        let key = |i: usize, salt: u64| {
            mix64(p.seed ^ mix64(u64::from(request.round) << 32 ^ (i as u64) << 8 ^ salt))
        };
        let count = match p.short {
            true => (key(0, 1) % (request.count as u64 + 1)) as usize,
            false => request.count,
        };
        let mut ahead = context.clone();
        ahead.push(request.bonus);
        let mut drafts = Vec::with_capacity(count + 1);
        for i in 0..count {
            let right = target_token(&ahead, sampling, request.output_index_base + i as u64);
            let token = if key(i, 2) % 100 < p.right_percent {
                right
            } else if key(i, 3) % 100 < p.out_of_range_percent {
                match key(i, 4) % 3 {
                    0 => u32::MAX,
                    _ => VOCAB + (key(i, 5) % 1000) as u32,
                }
            } else {
                (right + 1 + (key(i, 6) % u64::from(VOCAB - 1)) as u32) % VOCAB
            };
            drafts.push(token);
            // Later positions guess the target's continuation of these drafts, as a draft
            // model would, right or wrong.
            ahead.push(token);
        }
        if p.misbehaviour == Misbehaviour::TooManyAt(request.round) {
            drafts.resize(request.count + 1, 0);
        }
        Ok(drafts)
    }
}

impl Drafter for RandomDrafter {
    type Carry = Carry;
    type Error = RandomDrafterError;

    async fn open(&self, request: OpenRequest<Carry>) -> Result<Opened, RandomDrafterError> {
        if self.policy.misbehaviour == Misbehaviour::FailOpen {
            return Err(RandomDrafterError("injected open failure".into()));
        }
        self.mirrors
            .lock()
            .unwrap()
            .insert(request.session, (request.prompt_ids, request.sampling));
        Ok(Opened::default())
    }

    async fn draft(&self, request: DraftRequest<Carry>) -> Result<Vec<u32>, RandomDrafterError> {
        self.draft_now(request)
    }

    async fn close(&self, session: SessionId) -> Result<(), RandomDrafterError> {
        self.mirrors.lock().unwrap().remove(&session);
        Ok(())
    }

    fn close_detached(&self, session: SessionId) {
        self.mirrors.lock().unwrap().remove(&session);
    }
}

fn sampling() -> impl Strategy<Value = SamplingParams> {
    prop_oneof![
        Just(SamplingParams::GREEDY),
        (
            prop_oneof![Just(0.3f32), Just(0.9), Just(1.4)],
            prop_oneof![Just(1.0f32), Just(0.9), Just(0.5)],
            0u32..=12,
            any::<u64>(),
        )
            .prop_map(|(temperature, top_p, top_k, seed)| SamplingParams {
                temperature,
                top_p,
                top_k,
                seed,
            }),
    ]
}

fn block_size() -> impl Strategy<Value = BlockSizeConfig> {
    let size = prop_oneof![Just(1usize), Just(MAX_BLOCK), 1..=MAX_BLOCK];
    prop_oneof![
        size.clone().prop_map(BlockSizeConfig::fixed),
        (size.clone(), size, any::<bool>()).prop_map(|(requested, configured, cost_aware)| {
            BlockSizeConfig::adaptive(requested, configured).with_cost_aware(cost_aware)
        }),
    ]
}

fn stop_conditions() -> impl Strategy<Value = StopConditions> {
    (
        prop_oneof![Just(1usize), Just(MAX_TOKENS), 1..=MAX_TOKENS],
        prop::collection::vec(0..VOCAB, 0..=2),
        any::<bool>(),
        prop::collection::vec(
            prop::sample::select(vec!["ab", "c", " cat", "é", "x"]),
            0..=1,
        ),
    )
        .prop_map(|(max_tokens, eos, ignore_eos, stops)| StopConditions {
            max_tokens,
            eos_token_ids: eos,
            ignore_eos,
            stop_token_ids: Vec::new(),
            stop_strings: stops.into_iter().map(str::to_owned).collect(),
        })
}

fn draft_policy() -> impl Strategy<Value = DraftPolicy> {
    let misbehaviour = prop_oneof![
        6 => Just(Misbehaviour::None),
        1 => Just(Misbehaviour::FailOpen),
        1 => (0u32..6).prop_map(Misbehaviour::FailDraftAt),
        1 => (0u32..6).prop_map(Misbehaviour::TooManyAt),
    ];
    (
        any::<u64>(),
        prop_oneof![Just(0u64), Just(100), 0u64..=100],
        prop_oneof![Just(0u64), 0u64..=50],
        any::<bool>(),
        misbehaviour,
        any::<bool>(),
    )
        .prop_map(
            |(seed, right_percent, out_of_range_percent, short, misbehaviour, vocab_checked)| {
                DraftPolicy {
                    seed,
                    right_percent,
                    out_of_range_percent,
                    short,
                    misbehaviour,
                    vocab_checked,
                }
            },
        )
}

fn generation(
    prompt: &[u32],
    sampling: SamplingParams,
    stop: &StopConditions,
    block_size: BlockSizeConfig,
) -> GenerationRequest {
    GenerationRequest {
        seq: SEQ,
        session: SESSION,
        prompt_ids: prompt.to_vec(),
        sampling,
        stop: stop.clone(),
        block_size,
        cache_scope: Default::default(),
        rules: Default::default(),
        top_logprobs: None,
        forced_drafts: 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn speculative_output_equals_plain_decoding(
        prompt in prop::collection::vec(0..VOCAB, 1..=10),
        sampling in sampling(),
        stop in stop_conditions(),
        block_size in block_size(),
        policy in draft_policy(),
    ) {
        let plain_verifier = TableVerifier::default();
        let mut plain_events = Vec::new();
        let plain = block_on(RoundLoop::plain(&plain_verifier, &Pieces).run(
            generation(&prompt, sampling, &stop, BlockSizeConfig::PLAIN),
            &mut plain_events,
            &Default::default(),
        ))
        .expect("plain decoding runs");
        let plain_tokens = tokens_of(&plain_events);
        if stop.stop_strings.is_empty() {
            let eos: &[u32] = if stop.ignore_eos { &[] } else { &stop.eos_token_ids };
            let reference = reference_decode(&prompt, &sampling, stop.max_tokens, eos);
            prop_assert_eq!(&plain_tokens, &reference);
        }

        let verifier = TableVerifier::default();
        let drafter = RandomDrafter::new(policy);
        let mut round_loop = RoundLoop::new(&verifier, Some(&drafter), &Pieces);
        if policy.vocab_checked {
            round_loop = round_loop.with_vocab_size(VOCAB as usize);
        }
        let mut events = Vec::new();
        let finish = block_on(round_loop.run(
            generation(&prompt, sampling, &stop, block_size),
            &mut events,
            &Default::default(),
        ))
        .expect("speculative decoding runs");

        prop_assert_eq!(tokens_of(&events), plain_tokens);
        prop_assert_eq!(text_of(&events), text_of(&plain_events));
        prop_assert_eq!(finish.reason, plain.reason);
        prop_assert_eq!(finish.tokens_emitted, plain.tokens_emitted);
        prop_assert_eq!(finished_event(&events), Some(&finish));
        check_stats(&finish, &verifier, block_size, policy)?;

        let log = verifier.log();
        prop_assert_eq!(&log.released, &vec![SEQ]);
        prop_assert!(log.sequences.is_empty());
        prop_assert!(drafter.mirrors.lock().unwrap().is_empty(), "session left open");
    }
}

fn check_stats(
    finish: &Finish,
    verifier: &TableVerifier,
    block_size: BlockSizeConfig,
    policy: DraftPolicy,
) -> Result<(), TestCaseError> {
    let stats = &finish.stats;
    let log = verifier.log();
    prop_assert!(stats.accepted <= stats.drafted, "{stats:?}");
    prop_assert_eq!(stats.rounds, log.verifies.len() as u64);
    let verified_drafts: usize = log.verifies.iter().map(|v| v.tokens.len() - 1).sum();
    prop_assert_eq!(stats.drafted, verified_drafts as u64);
    prop_assert_eq!(stats.drafted_at_position.iter().sum::<u64>(), stats.drafted);
    prop_assert_eq!(
        stats.accepted_at_position.iter().sum::<u64>(),
        stats.accepted
    );
    for (accepted, drafted) in stats
        .accepted_at_position
        .iter()
        .zip(&stats.drafted_at_position)
    {
        prop_assert!(accepted <= drafted, "{stats:?}");
    }
    // The prefill token, then per round the accepted drafts and one target token, of which
    // a stop may cut the tail.
    prop_assert!(finish.tokens_emitted as u64 <= 1 + stats.accepted + stats.rounds);
    prop_assert!(log
        .verifies
        .iter()
        .all(|v| v.tokens.len() <= block_size.requested.max(1)));
    if !block_size.is_speculative() {
        prop_assert_eq!(stats.drafted, 0);
    }
    let refusable = policy.vocab_checked && policy.out_of_range_percent > 0;
    if stats.fallback.is_some() {
        prop_assert!(
            policy.misbehaviour != Misbehaviour::None || refusable,
            "fallback from a well-behaved drafter: {:?}",
            stats.fallback
        );
    }
    if policy.vocab_checked {
        prop_assert!(
            log.verifies
                .iter()
                .all(|v| v.tokens.iter().all(|&t| t < VOCAB)),
            "an out-of-vocabulary draft reached the verifier"
        );
    }
    // Drafts are judged only against the target's tokens.
    match policy.right_percent {
        0 => prop_assert_eq!(stats.accepted, 0),
        100 => prop_assert_eq!(stats.accepted, stats.drafted),
        _ => {}
    }
    Ok(())
}
