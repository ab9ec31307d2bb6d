//! Drafter failures fall back to plain decoding; verifier failures fail the request; both
//! sides are always cleaned up.

use specd_core::round_loop::{RequestControl, RoundLoop};
use specd_core::round_loop::{RequestError, RoundLoopError};
use specd_core::{BlockSizeConfig, FallbackCause, FinishReason, SamplingParams, StopConditions};

use crate::support::executor::block_on;
use crate::support::pieces::Pieces;
use crate::support::scenario::{request, run, samplings, tokens_of, PROMPT, SEQ, SESSION};
use crate::support::table_drafter::{Policy, TableDrafter};
use crate::support::table_target::{reference_decode, VOCAB};
use crate::support::table_verifier::{TableVerifier, VerifierFaults};

const MAX_TOKENS: usize = 30;

/// Runs with `drafter_policy` and `faults`; checks the output is still the reference and
/// returns the fallback and the verifier's (block width, want_carry) per round.
fn run_with_fallback(
    policy: Policy,
    faults: VerifierFaults,
) -> (
    Option<specd_core::DrafterFallback>,
    Vec<(usize, bool)>,
    TableDrafter,
) {
    let sampling = samplings()[2];
    let reference = reference_decode(&PROMPT, &sampling, MAX_TOKENS, &[]);
    let verifier = TableVerifier::with_faults(faults);
    let drafter = TableDrafter::new(policy);
    let stop = StopConditions::max_tokens(MAX_TOKENS);
    let (events, outcome) = run(
        &verifier,
        Some(&drafter),
        request(BlockSizeConfig::fixed(4), sampling, stop),
    );
    let finish = outcome.unwrap();
    assert_eq!(tokens_of(&events), reference, "{policy:?}");
    assert_eq!(finish.reason, FinishReason::Length);
    let log = verifier.log();
    assert_eq!(log.released, vec![SEQ]);
    let rounds = log
        .verifies
        .iter()
        .map(|v| (v.tokens.len(), v.want_carry))
        .collect();
    (finish.stats.fallback, rounds, drafter)
}

#[test]
fn failing_draft_call_falls_back_to_plain_rounds() {
    let (fallback, rounds, drafter) =
        run_with_fallback(Policy::FailAt(2), VerifierFaults::default());
    let fallback = fallback.expect("fallback recorded");
    assert_eq!((fallback.round, fallback.cause), (2, FallbackCause::Draft));
    assert!(fallback.message.contains("injected draft failure"));
    assert!(rounds[..2]
        .iter()
        .all(|&(width, carry)| width == 4 && carry));
    assert!(
        rounds[2..]
            .iter()
            .all(|&(width, carry)| width == 1 && !carry),
        "{rounds:?}"
    );
    let log = drafter.log();
    assert_eq!(log.drafts.len(), 3, "no draft call after the failure");
    assert_eq!(
        log.closed_detached,
        vec![SESSION],
        "the failed session is closed without waiting"
    );
    assert!(log.closed.is_empty());
}

#[test]
fn failing_open_falls_back_before_the_first_round() {
    let (fallback, rounds, drafter) =
        run_with_fallback(Policy::FailOpen, VerifierFaults::default());
    let fallback = fallback.expect("fallback recorded");
    assert_eq!((fallback.round, fallback.cause), (0, FallbackCause::Open));
    assert!(rounds.iter().all(|&(width, carry)| width == 1 && !carry));
    let log = drafter.log();
    assert!(log.drafts.is_empty());
    assert_eq!(log.closed_detached, vec![SESSION]);
}

#[test]
fn too_many_drafts_fall_back() {
    let (fallback, rounds, _) = run_with_fallback(Policy::TooManyAt(1), VerifierFaults::default());
    let fallback = fallback.expect("fallback recorded");
    assert_eq!(
        (fallback.round, fallback.cause),
        (1, FallbackCause::InvalidDraft)
    );
    assert_eq!(rounds[0].0, 4);
    assert!(rounds[1..].iter().all(|&(width, _)| width == 1));
}

#[test]
fn drafts_outside_the_vocabulary_fall_back_before_the_verifier_sees_them() {
    let sampling = samplings()[2];
    let reference = reference_decode(&PROMPT, &sampling, MAX_TOKENS, &[]);
    let verifier = TableVerifier::with_faults(VerifierFaults::default());
    let drafter = TableDrafter::new(Policy::OutOfVocabularyAt(2));
    let mut events = Vec::new();
    let finish = block_on(
        RoundLoop::new(&verifier, Some(&drafter), &Pieces)
            .with_vocab_size(VOCAB as usize)
            .run(
                request(
                    BlockSizeConfig::fixed(4),
                    sampling,
                    StopConditions::max_tokens(MAX_TOKENS),
                ),
                &mut events,
                &RequestControl::new(),
            ),
    )
    .unwrap();
    assert_eq!(tokens_of(&events), reference);
    let fallback = finish.stats.fallback.expect("fallback recorded");
    assert_eq!(
        (fallback.round, fallback.cause),
        (2, FallbackCause::InvalidDraft)
    );
    assert!(
        fallback.message.contains("vocabulary"),
        "{}",
        fallback.message
    );
    let log = verifier.log();
    assert!(
        log.verifies
            .iter()
            .all(|v| v.tokens.iter().all(|&t| t < VOCAB)),
        "an out-of-vocabulary draft reached the verifier"
    );
}

#[test]
fn missing_carry_falls_back() {
    let faults = VerifierFaults {
        no_carry_at_round: Some(1),
        ..VerifierFaults::default()
    };
    let (fallback, rounds, drafter) = run_with_fallback(Policy::Oracle, faults);
    let fallback = fallback.expect("fallback recorded");
    assert_eq!(fallback.cause, FallbackCause::MissingCarry);
    assert_eq!(fallback.round, 1, "the round whose answer lacked the carry");
    assert!(rounds[2..].iter().all(|&(width, _)| width == 1));
    assert!(drafter.log().inconsistencies.is_empty());
}

#[test]
fn verifier_failure_fails_the_request_and_cleans_up() {
    let verifier = TableVerifier::with_faults(VerifierFaults {
        fail_at_round: Some(1),
        ..VerifierFaults::default()
    });
    let drafter = TableDrafter::new(Policy::Oracle);
    let stop = StopConditions::max_tokens(MAX_TOKENS);
    let (events, outcome) = run(
        &verifier,
        Some(&drafter),
        request(BlockSizeConfig::fixed(4), samplings()[0], stop),
    );
    let error = outcome.unwrap_err();
    assert!(matches!(error, RoundLoopError::Verifier(_)), "{error}");
    assert!(error.to_string().contains("injected failure"), "{error}");
    assert_eq!(
        tokens_of(&events).len(),
        5,
        "prefill token and one round went out"
    );
    assert!(
        events
            .iter()
            .all(|e| matches!(e, specd_core::Event::Tokens(_))),
        "no Finished event"
    );
    assert_eq!(verifier.log().released, vec![SEQ]);
    assert_eq!(drafter.log().closed, vec![SESSION]);
}

#[test]
fn inconsistent_verify_answer_is_an_error() {
    let verifier = TableVerifier::with_faults(VerifierFaults {
        extra_token_at_round: Some(0),
        ..VerifierFaults::default()
    });
    let drafter = TableDrafter::new(Policy::Random);
    let stop = StopConditions::max_tokens(MAX_TOKENS);
    let (_, outcome) = run(
        &verifier,
        Some(&drafter),
        request(BlockSizeConfig::fixed(4), samplings()[0], stop),
    );
    match outcome.unwrap_err() {
        RoundLoopError::InvalidVerifyAnswer { round, reason } => {
            assert_eq!(round, 0);
            assert!(reason.contains("new tokens"), "{reason}");
        }
        other => panic!("unexpected error {other}"),
    }
    assert_eq!(verifier.log().released, vec![SEQ]);
    assert_eq!(drafter.log().closed, vec![SESSION]);
}

#[test]
fn invalid_requests_name_the_field_and_touch_nothing() {
    let stop = StopConditions::max_tokens(5);
    let mut empty_prompt = request(BlockSizeConfig::fixed(4), samplings()[0], stop.clone());
    empty_prompt.prompt_ids.clear();
    let bad_temperature = request(
        BlockSizeConfig::fixed(4),
        SamplingParams {
            temperature: -1.0,
            ..SamplingParams::GREEDY
        },
        stop,
    );
    let zero_budget = request(
        BlockSizeConfig::fixed(4),
        samplings()[0],
        StopConditions::max_tokens(0),
    );
    for (request, field) in [
        (empty_prompt, "prompt_ids"),
        (bad_temperature, "temperature"),
        (zero_budget, "max_tokens"),
    ] {
        let verifier = TableVerifier::default();
        let drafter = TableDrafter::new(Policy::Oracle);
        let (events, outcome) = run(&verifier, Some(&drafter), request);
        match outcome.unwrap_err() {
            RoundLoopError::InvalidRequest(error) => {
                assert_eq!(error.field(), field);
                assert!(error.to_string().contains(field), "{error}");
                if field == "prompt_ids" {
                    assert_eq!(error, RequestError::EmptyPrompt);
                }
            }
            other => panic!("unexpected error {other}"),
        }
        assert!(events.is_empty());
        let log = verifier.log();
        assert!(
            log.prefills.is_empty() && log.released.is_empty() && log.released_detached.is_empty()
        );
        assert!(drafter.log().opens.is_empty());
    }
}
