//! The hybrid drafter in the round loop: output is the plain output, lookup drafts the rounds
//! that copy earlier text, the inner drafter the others, and the inner session still sees
//! every round.

use specd_core::hybrid::{HybridDrafter, MAX_SKIPPED_ROUNDS};
use specd_core::{BlockSizeConfig, FallbackCause, FinishReason, SpecStats, StopConditions};

use crate::support::pieces::decode;
use crate::support::scenario::{
    finished_event, request, run_with, samplings, text_of, tokens_of, PROMPT, SEQ, SESSION,
};
use crate::support::table_drafter::{Policy, TableDrafter};
use crate::support::table_target::{reference_decode_on, Target};
use crate::support::table_verifier::TableVerifier;

const MAX_TOKENS: usize = 40;

const TARGETS: [Target; 2] = [Target::Hashed, Target::Repeating];

fn block_configs() -> Vec<BlockSizeConfig> {
    let mut configs: Vec<BlockSizeConfig> = (2..=8).map(BlockSizeConfig::fixed).collect();
    configs.push(BlockSizeConfig::adaptive(8, 4).with_cost_aware(false));
    configs.push(BlockSizeConfig::adaptive(8, 4));
    configs
}

/// A run of `target` with a hybrid over a table drafter of `policy`; asserts the output is
/// the plain output, both sessions were closed and the inner drafter saw a consistent
/// history, and returns the stats and the drafter.
fn run_hybrid(
    target: Target,
    sampling_index: usize,
    policy: Policy,
    block: BlockSizeConfig,
    max_tokens: usize,
) -> (SpecStats, HybridDrafter<TableDrafter>) {
    let sampling = samplings()[sampling_index];
    let reference = reference_decode_on(target, &PROMPT, &sampling, max_tokens, &[]);
    let verifier = TableVerifier::with_target(target);
    let drafter = HybridDrafter::with_default_lookup(TableDrafter::new(policy));
    let stop = StopConditions::max_tokens(max_tokens);
    let (events, outcome) = run_with(&verifier, Some(&drafter), request(block, sampling, stop));
    let case = format!("{target:?} sampling {sampling_index} {policy:?} {block:?}");
    let finish = outcome.unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(tokens_of(&events), reference, "{case}");
    assert_eq!(text_of(&events), decode(&reference), "{case}");
    assert_eq!(finish.reason, FinishReason::Length, "{case}");
    assert_eq!(finished_event(&events), Some(&finish), "{case}");
    assert_eq!(
        finish.stats.rounds,
        verifier.log().verifies.len() as u64,
        "{case}"
    );
    assert_eq!(verifier.log().released, vec![SEQ], "{case}");
    assert_eq!(drafter.session_count(), 0, "{case}: session left open");
    {
        let inner = drafter.inner().log();
        assert!(
            inner.inconsistencies.is_empty(),
            "{case}: {:?}",
            inner.inconsistencies
        );
        assert_eq!(inner.opens, [SESSION], "{case}");
        let closed = inner.closed.len() + inner.closed_detached.len();
        assert_eq!(closed, 1, "{case}: inner session not closed once");
    }
    (finish.stats, drafter)
}

#[test]
fn hybrid_output_equals_plain_output() {
    for target in TARGETS {
        for sampling_index in 0..samplings().len() {
            for policy in [Policy::Oracle, Policy::Random, Policy::PartlyRight] {
                for block in block_configs() {
                    let (stats, _) = run_hybrid(target, sampling_index, policy, block, MAX_TOKENS);
                    assert!(stats.fallback.is_none(), "{:?}", stats.fallback);
                    assert!(stats.accepted <= stats.drafted);
                }
            }
        }
    }
}

#[test]
fn lookup_drafts_when_the_output_copies_the_prompt() {
    // The greedy repeating target writes the prompt over and over. The inner table drafter
    // guesses the hashed target, wrongly here; it drafts the first rounds, while the match
    // is shorter than 4, and lookup all the rest, every draft right.
    let (stats, drafter) = run_hybrid(
        Target::Repeating,
        0,
        Policy::Oracle,
        BlockSizeConfig::fixed(4),
        MAX_TOKENS,
    );
    let inner_rounds = drafter.inner().log().drafts.len() as u64;
    assert!(
        (1..=3).contains(&inner_rounds),
        "{inner_rounds} inner rounds, {stats:?}"
    );
    assert!(stats.rounds >= inner_rounds + 5, "{stats:?}");
    // The inner drafter was asked for 3 drafts each time; lookup drafted the rest.
    let lookup_drafted = stats.drafted - 3 * inner_rounds;
    assert!(
        stats.accepted >= lookup_drafted && lookup_drafted > 0,
        "{stats:?}"
    );
}

#[test]
fn the_inner_drafter_drafts_output_that_does_not_repeat() {
    // The hashed target rarely repeats four tokens, so the oracle inner drafter drafts every
    // round and every draft is accepted.
    let (stats, drafter) = run_hybrid(
        Target::Hashed,
        0,
        Policy::Oracle,
        BlockSizeConfig::fixed(4),
        MAX_TOKENS,
    );
    assert_eq!(drafter.inner().log().drafts.len() as u64, stats.rounds);
    assert_eq!(stats.accepted, stats.drafted, "{stats:?}");
}

#[test]
fn the_inner_drafter_sees_every_round_in_order() {
    // Sampled repetition mixes lookup rounds and inner rounds; the table drafter checks that
    // each call's carries are its committed tokens and that its mirror of the context has
    // exactly `committed_len` tokens (run_hybrid asserts it found nothing wrong).
    let mut catch_ups = 0;
    for sampling_index in 1..samplings().len() {
        for block in [2, 4, 8] {
            let (stats, drafter) = run_hybrid(
                Target::Repeating,
                sampling_index,
                Policy::Oracle,
                BlockSizeConfig::fixed(block),
                80,
            );
            let inner = drafter.inner().log();
            assert!(inner.drafts.len() as u64 <= stats.rounds);
            // Rounds drafted by lookup reach the inner drafter with its next call.
            catch_ups += inner.drafts.iter().filter(|d| d.carries > 1).count();
            let received: usize = inner.drafts.iter().map(|d| d.carries).sum();
            assert!(received as u64 <= stats.rounds);
            assert!(inner
                .drafts
                .windows(2)
                .all(|pair| pair[0].committed_len < pair[1].committed_len));
        }
    }
    assert!(catch_ups > 0, "no inner call followed lookup rounds");
}

#[test]
fn a_long_copy_still_hands_rounds_to_the_inner_drafter() {
    // Greedy repetition for long enough that the lookup streak reaches its bound: the inner
    // drafter gets a round that catches it up on MAX_SKIPPED_ROUNDS lookup rounds.
    let max_tokens = 4 * (MAX_SKIPPED_ROUNDS + 4) * 3;
    let (_, drafter) = run_hybrid(
        Target::Repeating,
        0,
        Policy::Oracle,
        BlockSizeConfig::fixed(4),
        max_tokens,
    );
    let inner = drafter.inner().log();
    assert!(
        inner
            .drafts
            .iter()
            .any(|d| d.carries == MAX_SKIPPED_ROUNDS + 1),
        "{:?}",
        inner.drafts.iter().map(|d| d.carries).collect::<Vec<_>>()
    );
    assert!(inner
        .drafts
        .iter()
        .all(|d| d.carries <= MAX_SKIPPED_ROUNDS + 1));
}

#[test]
fn inner_failures_fall_back_to_plain_decoding() {
    for (policy, cause) in [
        (Policy::FailOpen, FallbackCause::Open),
        (Policy::FailAt(1), FallbackCause::Draft),
    ] {
        let sampling = samplings()[1];
        let reference = reference_decode_on(Target::Hashed, &PROMPT, &sampling, MAX_TOKENS, &[]);
        let verifier = TableVerifier::with_target(Target::Hashed);
        let drafter = HybridDrafter::with_default_lookup(TableDrafter::new(policy));
        let stop = StopConditions::max_tokens(MAX_TOKENS);
        let (events, outcome) = run_with(
            &verifier,
            Some(&drafter),
            request(BlockSizeConfig::fixed(4), sampling, stop),
        );
        let finish = outcome.unwrap();
        assert_eq!(tokens_of(&events), reference, "{policy:?}");
        let fallback = finish.stats.fallback.expect("fallback recorded");
        assert_eq!(fallback.cause, cause, "{policy:?}");
        assert!(fallback.message.contains("hybrid drafter"), "{fallback:?}");
        assert_eq!(drafter.session_count(), 0, "{policy:?}");
    }
}
