//! The n-gram drafter in the round loop: output is the plain output, and repetitive targets
//! get their drafts accepted.

use specd_core::ngram::{NgramConfig, NgramDrafter};
use specd_core::{BlockSizeConfig, FinishReason, RequestControl, RoundLoop, StopConditions};

use crate::support::executor::block_on;
use crate::support::pieces::{decode, Pieces};
use crate::support::scenario::{
    finished_event, request, run, run_with, samplings, text_of, tokens_of, PROMPT, SEQ,
};
use crate::support::sinks::ReactingSink;
use crate::support::table_target::{reference_decode_on, Target};
use crate::support::table_verifier::{Carry, TableVerifier};

const MAX_TOKENS: usize = 40;

const TARGETS: [Target; 2] = [Target::Hashed, Target::Repeating];

fn configs() -> [NgramConfig; 3] {
    [
        NgramConfig::default(),
        NgramConfig {
            min_ngram: 2,
            max_ngram: 5,
        },
        NgramConfig {
            min_ngram: 1,
            max_ngram: 1,
        },
    ]
}

fn block_configs() -> Vec<BlockSizeConfig> {
    let mut configs: Vec<BlockSizeConfig> = (2..=8).map(BlockSizeConfig::fixed).collect();
    configs.push(BlockSizeConfig::adaptive(8, 4).with_cost_aware(false));
    configs
}

#[test]
fn ngram_output_equals_plain_output() {
    let stop = StopConditions::max_tokens(MAX_TOKENS);
    for target in TARGETS {
        for sampling in samplings() {
            let reference = reference_decode_on(target, &PROMPT, &sampling, MAX_TOKENS, &[]);
            let plain = TableVerifier::with_target(target);
            let (plain_events, _) = run(
                &plain,
                None,
                request(BlockSizeConfig::PLAIN, sampling, stop.clone()),
            );
            assert_eq!(
                tokens_of(&plain_events),
                reference,
                "K=0, {target:?} {sampling:?}"
            );

            for config in configs() {
                let drafter = NgramDrafter::<Carry>::new(config).unwrap();
                for block_size in block_configs() {
                    let case = format!("{target:?} {sampling:?} {config:?} {block_size:?}");
                    let verifier = TableVerifier::with_target(target);
                    let (events, outcome) = run_with(
                        &verifier,
                        Some(&drafter),
                        request(block_size, sampling, stop.clone()),
                    );
                    let finish = outcome.unwrap_or_else(|e| panic!("{case}: {e}"));
                    assert_eq!(tokens_of(&events), reference, "{case}");
                    assert_eq!(text_of(&events), decode(&reference), "{case}");
                    assert_eq!(finish.reason, FinishReason::Length, "{case}");
                    assert_eq!(finished_event(&events), Some(&finish), "{case}");
                    let stats = &finish.stats;
                    assert!(stats.fallback.is_none(), "{case}: {:?}", stats.fallback);
                    assert!(stats.accepted <= stats.drafted, "{case}");
                    let log = verifier.log();
                    assert_eq!(stats.rounds, log.verifies.len() as u64, "{case}");
                    assert!(
                        log.verifies
                            .iter()
                            .all(|v| v.tokens.len() <= block_size.requested),
                        "{case}"
                    );
                    assert_eq!(log.released, vec![SEQ], "{case}");
                    assert_eq!(drafter.session_count(), 0, "{case}: session left open");
                }
            }
        }
    }
}

/// Runs `target` with the default n-gram drafter at a fixed block size.
fn ngram_stats(target: Target, sampling_index: usize, block_size: usize) -> specd_core::SpecStats {
    let verifier = TableVerifier::with_target(target);
    let drafter = NgramDrafter::<Carry>::default();
    let stop = StopConditions::max_tokens(MAX_TOKENS);
    let (_, outcome) = run_with(
        &verifier,
        Some(&drafter),
        request(
            BlockSizeConfig::fixed(block_size),
            samplings()[sampling_index],
            stop,
        ),
    );
    outcome.unwrap().stats
}

#[test]
fn greedy_repetition_is_drafted_perfectly() {
    // The greedy repeating target emits the prompt over and over; the first bonus repeats the
    // prompt's first token, so from the first round on every draft is right.
    let stats = ngram_stats(Target::Repeating, 0, 4);
    assert!(stats.drafted > 0);
    assert_eq!(stats.accepted, stats.drafted, "{stats:?}");
    // The first round's match is that one token, which earns one draft; from the second on
    // the match is at least 3 long and every round drafts the full 3. 39 tokens after the
    // first: 2 in the first round, 4 in each of the next 9, then one cut to the budget (a
    // block of 2).
    assert_eq!(stats.rounds, 11, "{stats:?}");
    assert_eq!(stats.drafted_at_position, [11, 9, 9], "{stats:?}");
}

#[test]
fn drafts_grow_with_the_match_over_a_copied_prompt() {
    // Greedy repetition of the prompt: the match grows by each round's tokens, and with a
    // ramp up to 8 so does the number of drafts, until the block size caps it.
    let verifier = TableVerifier::with_target(Target::Repeating);
    let drafter = NgramDrafter::<Carry>::new(NgramConfig {
        min_ngram: 1,
        max_ngram: 8,
    })
    .unwrap();
    let stop = StopConditions::max_tokens(MAX_TOKENS);
    let (events, outcome) = run_with(
        &verifier,
        Some(&drafter),
        request(BlockSizeConfig::fixed(9), samplings()[0], stop),
    );
    let finish = outcome.unwrap();
    let reference =
        reference_decode_on(Target::Repeating, &PROMPT, &samplings()[0], MAX_TOKENS, &[]);
    assert_eq!(tokens_of(&events), reference);
    let widths: Vec<usize> = verifier.widths();
    // Matches of 1, then 3 (1 + 2 committed), then 7, then the full 8 drafts.
    assert_eq!(widths[..4], [2, 4, 8, 9], "{widths:?}");
    assert_eq!(finish.stats.accepted, finish.stats.drafted);
}

#[test]
fn sampled_repetition_gets_drafts_accepted() {
    for sampling_index in 1..samplings().len() {
        for block_size in [2, 4, 8] {
            let repeating = ngram_stats(Target::Repeating, sampling_index, block_size);
            let hashed = ngram_stats(Target::Hashed, sampling_index, block_size);
            let case = format!("sampling {sampling_index}, block {block_size}");
            assert!(repeating.accepted > 0, "{case}: {repeating:?}");
            assert!(
                repeating.accepted > hashed.accepted,
                "{case}: repeating {repeating:?}, hashed {hashed:?}"
            );
        }
    }
}

#[test]
fn rounds_capped_to_plain_still_feed_the_history() {
    // Rounds capped to 1 draft nothing, so the next draft call carries several rounds of
    // committed tokens at once; a lost or doubled token would trip the drafter's
    // `committed_len` check and show up as a fallback.
    let sampling = samplings()[0];
    let reference = reference_decode_on(Target::Repeating, &PROMPT, &sampling, MAX_TOKENS, &[]);
    let verifier = TableVerifier::with_target(Target::Repeating);
    let drafter = NgramDrafter::<Carry>::default();
    let control = RequestControl::new();
    let mut sink = ReactingSink {
        events: Vec::new(),
        control: control.clone(),
        on_event: |seen: usize, control: &RequestControl| match seen {
            2 => control.set_block_cap(Some(1)),
            6 => control.set_block_cap(None),
            _ => {}
        },
    };
    let stop = StopConditions::max_tokens(MAX_TOKENS);
    let finish = block_on(RoundLoop::new(&verifier, Some(&drafter), &Pieces).run(
        request(BlockSizeConfig::fixed(4), sampling, stop),
        &mut sink,
        &control,
    ))
    .unwrap();
    assert_eq!(tokens_of(&sink.events), reference);
    assert!(
        finish.stats.fallback.is_none(),
        "{:?}",
        finish.stats.fallback
    );
    let widths: Vec<usize> = verifier.widths();
    assert!(
        widths[1..5].iter().all(|&w| w == 1),
        "capped rounds: {widths:?}"
    );
    assert_eq!(widths[5], 4, "cap lifted: {widths:?}");
    assert!(finish.stats.accepted > 0);
    assert_eq!(finish.stats.accepted, finish.stats.drafted);
    assert_eq!(drafter.session_count(), 0);
}

#[test]
fn one_drafter_serves_requests_one_after_another() {
    let drafter = NgramDrafter::<Carry>::default();
    for sampling in samplings() {
        let verifier = TableVerifier::with_target(Target::Repeating);
        let stop = StopConditions::max_tokens(MAX_TOKENS);
        let (events, outcome) = run_with(
            &verifier,
            Some(&drafter),
            request(BlockSizeConfig::fixed(3), sampling, stop),
        );
        outcome.unwrap();
        let reference = reference_decode_on(Target::Repeating, &PROMPT, &sampling, MAX_TOKENS, &[]);
        assert_eq!(tokens_of(&events), reference);
        assert_eq!(drafter.session_count(), 0);
    }
}
