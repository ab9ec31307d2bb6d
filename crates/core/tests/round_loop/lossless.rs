//! Speculative output equals plain output, whatever the drafter and block size.

use specd_core::{BlockSizeConfig, FinishReason, RoundLoop, StopConditions};

use crate::support::executor::block_on;
use crate::support::pieces::{decode, Pieces};
use crate::support::scenario::{
    finished_event, request, run, samplings, text_of, tokens_of, PROMPT, SEQ, SESSION,
};
use crate::support::table_drafter::{Policy, TableDrafter};
use crate::support::table_target::reference_decode;
use crate::support::table_verifier::TableVerifier;

const MAX_TOKENS: usize = 40;

const POLICIES: [Policy; 4] = [
    Policy::Oracle,
    Policy::Random,
    Policy::Adversarial,
    Policy::PartlyRight,
];

fn block_configs() -> Vec<BlockSizeConfig> {
    let mut configs: Vec<BlockSizeConfig> = (1..=8).map(BlockSizeConfig::fixed).collect();
    configs.push(BlockSizeConfig::adaptive(8, 4).with_cost_aware(false));
    configs
}

#[test]
fn speculative_output_equals_plain_output() {
    for sampling in samplings() {
        let reference = reference_decode(&PROMPT, &sampling, MAX_TOKENS, &[]);
        let stop = StopConditions::max_tokens(MAX_TOKENS);
        let plain = TableVerifier::default();
        let (plain_events, _) = run(
            &plain,
            None,
            request(BlockSizeConfig::PLAIN, sampling, stop.clone()),
        );
        assert_eq!(
            tokens_of(&plain_events),
            reference,
            "K=0 vs reference, {sampling:?}"
        );

        for policy in POLICIES {
            for block_size in block_configs() {
                let case = format!("{sampling:?} {policy:?} {block_size:?}");
                let verifier = TableVerifier::default();
                let drafter = TableDrafter::new(policy);
                let (events, outcome) = run(
                    &verifier,
                    Some(&drafter),
                    request(block_size, sampling, stop.clone()),
                );
                let finish = outcome.unwrap_or_else(|e| panic!("{case}: {e}"));
                assert_eq!(tokens_of(&events), reference, "{case}");
                assert_eq!(text_of(&events), decode(&reference), "{case}");
                assert_eq!(finish.reason, FinishReason::Length, "{case}");
                assert_eq!(finish.tokens_emitted, MAX_TOKENS, "{case}");
                assert_eq!(finished_event(&events), Some(&finish), "{case}");
                assert!(finish.stats.fallback.is_none(), "{case}");
                check_draft_calls(&drafter, &case);
                check_round_bookkeeping(&verifier, &finish.stats, &case);
                check_cleanup(&verifier, &drafter, block_size.is_speculative(), &case);
            }
        }
    }
}

/// Every verify fits its budget, output indices follow the emitted count, and the stats add
/// up.
fn check_round_bookkeeping(verifier: &TableVerifier, stats: &specd_core::SpecStats, case: &str) {
    let log = verifier.log();
    assert_eq!(stats.rounds, log.verifies.len() as u64, "{case}");
    let drafted: usize = log.verifies.iter().map(|v| v.tokens.len() - 1).sum();
    assert_eq!(stats.drafted, drafted as u64, "{case}");
    assert_eq!(log.verifies[0].output_index_base, 1, "{case}");
    for v in &log.verifies {
        assert!(
            v.tokens.len() <= v.budget + 1,
            "{case}: block {v:?} exceeds its budget"
        );
        assert_eq!(
            v.budget as u64,
            MAX_TOKENS as u64 - v.output_index_base,
            "{case}"
        );
    }
    for pair in log.verifies.windows(2) {
        let step = pair[1].output_index_base - pair[0].output_index_base;
        assert!(
            (1..=pair[0].tokens.len() as u64).contains(&step),
            "{case}: round {} emitted {step} tokens from a block of {}",
            pair[0].round,
            pair[0].tokens.len()
        );
    }
    // Every round emits accepted + 1 tokens, except that the final bonus may be cut.
    let produced = 1 + stats.accepted + stats.rounds;
    assert!(
        produced == MAX_TOKENS as u64 || produced == MAX_TOKENS as u64 + 1,
        "{case}: 1 + accepted + rounds = {produced}"
    );
    let position_total: u64 = stats.accepted_at_position.iter().sum();
    assert_eq!(position_total, stats.accepted, "{case}");
}

/// The drafter saw consistent carries and positions: the bonus sits at `committed_len`,
/// one before the output index of the first draft.
fn check_draft_calls(drafter: &TableDrafter, case: &str) {
    let log = drafter.log();
    assert!(
        log.inconsistencies.is_empty(),
        "{case}: {:?}",
        log.inconsistencies
    );
    for call in &log.drafts {
        assert!(call.count >= 1, "{case}");
        assert_eq!(
            call.committed_len as u64,
            PROMPT.len() as u64 + call.output_index_base - 1,
            "{case}: round {}",
            call.round
        );
        let expected_carries = if call.round == 0 { 0 } else { 1 };
        assert_eq!(
            call.carries, expected_carries,
            "{case}: round {}",
            call.round
        );
    }
}

fn check_cleanup(verifier: &TableVerifier, drafter: &TableDrafter, speculative: bool, case: &str) {
    let vlog = verifier.log();
    assert_eq!(vlog.released, vec![SEQ], "{case}");
    assert!(vlog.released_detached.is_empty(), "{case}");
    assert!(vlog.sequences.is_empty(), "{case}");
    let dlog = drafter.log();
    if speculative {
        assert_eq!(dlog.opens, vec![SESSION], "{case}");
        assert_eq!(dlog.closed, vec![SESSION], "{case}");
    } else {
        assert!(dlog.opens.is_empty() && dlog.drafts.is_empty(), "{case}");
        assert!(dlog.closed.is_empty(), "{case}");
    }
    assert!(dlog.closed_detached.is_empty(), "{case}");
}

#[test]
fn oracle_drafts_are_all_accepted() {
    let sampling = samplings()[1];
    let verifier = TableVerifier::default();
    let drafter = TableDrafter::new(Policy::Oracle);
    let stop = StopConditions::max_tokens(MAX_TOKENS);
    let (_, outcome) = run(
        &verifier,
        Some(&drafter),
        request(BlockSizeConfig::fixed(5), sampling, stop),
    );
    let stats = outcome.unwrap().stats;
    assert_eq!(stats.accepted, stats.drafted);
    assert_eq!(stats.accepted_at_position, stats.drafted_at_position);
    // 39 tokens after the first, 5 per round: 7 full rounds then a block cut to the budget.
    assert_eq!(stats.rounds, 8);
    assert_eq!(stats.accepted_tokens_per_round(), Some(5.0));
}

#[test]
fn adversarial_drafts_are_never_accepted() {
    let verifier = TableVerifier::default();
    let drafter = TableDrafter::new(Policy::Adversarial);
    let stop = StopConditions::max_tokens(MAX_TOKENS);
    let (_, outcome) = run(
        &verifier,
        Some(&drafter),
        request(BlockSizeConfig::fixed(4), samplings()[0], stop),
    );
    let stats = outcome.unwrap().stats;
    assert_eq!(stats.accepted, 0);
    assert_eq!(stats.rounds, MAX_TOKENS as u64 - 1);
    // Three drafts per round, fewer in the last two rounds where the budget caps the block.
    assert_eq!(stats.drafted, 3 * (MAX_TOKENS as u64 - 3) + 2 + 1);
    let summary = stats.format().unwrap();
    assert!(
        summary
            .starts_with("1.00 accepted tokens/round (0.00 accepted drafts/round, 0.0% of drafted"),
        "{summary}"
    );
}

#[test]
fn adaptive_block_size_grows_after_warm_up_with_a_good_drafter() {
    let verifier = TableVerifier::default();
    let drafter = TableDrafter::new(Policy::Oracle);
    let stop = StopConditions::max_tokens(200);
    let config = BlockSizeConfig::adaptive(8, 3).with_cost_aware(false);
    let (_, outcome) = run(
        &verifier,
        Some(&drafter),
        request(config, samplings()[0], stop),
    );
    outcome.unwrap();
    let widths: Vec<usize> = verifier.widths();
    assert!(
        widths[..8].iter().all(|&w| w == 3),
        "warm-up at the configured depth: {widths:?}"
    );
    assert_eq!(widths[8], 8, "then the requested size: {widths:?}");
}

#[test]
fn plain_loop_without_drafter_matches_reference() {
    for sampling in samplings() {
        let reference = reference_decode(&PROMPT, &sampling, MAX_TOKENS, &[]);
        let verifier = TableVerifier::default();
        let mut events = Vec::new();
        let stop = StopConditions::max_tokens(MAX_TOKENS);
        // A speculative block size without a drafter silently decodes plainly.
        let finish = block_on(RoundLoop::plain(&verifier, &Pieces).run(
            request(BlockSizeConfig::fixed(4), sampling, stop),
            &mut events,
            &Default::default(),
        ))
        .unwrap();
        assert_eq!(tokens_of(&events), reference);
        assert!(finish.stats.fallback.is_none());
        assert_eq!(finish.stats.drafted, 0);
        let log = verifier.log();
        assert!(log
            .verifies
            .iter()
            .all(|v| v.tokens.len() == 1 && !v.want_carry));
        assert!(!log.prefills[0].want_carry);
    }
}

#[test]
fn the_round_loop_future_is_send() {
    fn assert_send<F: Send>(_: &F) {}
    let verifier = TableVerifier::default();
    let drafter = TableDrafter::new(Policy::Oracle);
    let round_loop = RoundLoop::new(&verifier, Some(&drafter), &Pieces);
    let mut events = Vec::new();
    let control = Default::default();
    let stop = StopConditions::max_tokens(3);
    let future = round_loop.run(
        request(BlockSizeConfig::fixed(2), samplings()[0], stop),
        &mut events,
        &control,
    );
    assert_send(&future);
    block_on(future).unwrap();
    assert_eq!(tokens_of(&events).len(), 3);
}
