//! Cancellation, closed sinks, dropped futures and load caps.

use specd_core::{BlockSizeConfig, Event, FinishReason, RequestControl, RoundLoop, StopConditions};

use crate::support::executor::{block_on, poll_times};
use crate::support::pieces::Pieces;
use crate::support::scenario::{request, samplings, tokens_of, PROMPT, SEQ, SESSION};
use crate::support::sinks::{ClosingSink, ReactingSink};
use crate::support::table_drafter::{Policy, TableDrafter};
use crate::support::table_target::reference_decode;
use crate::support::table_verifier::{TableVerifier, VerifierFaults};

const MAX_TOKENS: usize = 40;

#[test]
fn cancel_flag_stops_before_the_next_round_and_cleans_up() {
    let sampling = samplings()[1];
    let reference = reference_decode(&PROMPT, &sampling, MAX_TOKENS, &[]);
    let verifier = TableVerifier::default();
    let drafter = TableDrafter::new(Policy::PartlyRight);
    let control = RequestControl::new();
    let mut sink = ReactingSink {
        events: Vec::new(),
        control: control.clone(),
        on_event: |seen: usize, control: &RequestControl| {
            if seen == 3 {
                control.cancel();
            }
        },
    };
    let stop = StopConditions::max_tokens(MAX_TOKENS);
    let finish = block_on(RoundLoop::new(&verifier, Some(&drafter), &Pieces).run(
        request(BlockSizeConfig::fixed(4), sampling, stop),
        &mut sink,
        &control,
    ))
    .unwrap();
    assert_eq!(finish.reason, FinishReason::Cancelled);
    let tokens = tokens_of(&sink.events);
    assert_eq!(tokens, reference[..tokens.len()]);
    assert_eq!(sink.events.len(), 4, "prefill, two rounds, then Finished");
    assert!(
        matches!(sink.events.last(), Some(Event::Finished(f)) if f.reason == FinishReason::Cancelled)
    );
    assert_eq!(verifier.log().verifies.len(), 2);
    assert_eq!(verifier.log().released, vec![SEQ]);
    assert_eq!(drafter.log().closed, vec![SESSION]);
}

#[test]
fn closed_sink_cancels_and_cleans_up() {
    let verifier = TableVerifier::default();
    let drafter = TableDrafter::new(Policy::Oracle);
    let mut sink = ClosingSink {
        events: Vec::new(),
        open_for: 2,
    };
    let stop = StopConditions::max_tokens(MAX_TOKENS);
    let finish = block_on(RoundLoop::new(&verifier, Some(&drafter), &Pieces).run(
        request(BlockSizeConfig::fixed(4), samplings()[0], stop),
        &mut sink,
        &RequestControl::new(),
    ))
    .unwrap();
    assert_eq!(finish.reason, FinishReason::Cancelled);
    assert_eq!(sink.events.len(), 2);
    assert_eq!(
        verifier.log().verifies.len(),
        2,
        "the round whose event failed was the last"
    );
    assert_eq!(verifier.log().released, vec![SEQ]);
    assert_eq!(drafter.log().closed, vec![SESSION]);
}

#[test]
fn dropping_the_future_frees_both_sides_without_waiting() {
    let verifier = TableVerifier::with_faults(VerifierFaults {
        hang_at_round: Some(2),
        ..VerifierFaults::default()
    });
    let drafter = TableDrafter::new(Policy::Oracle);
    let mut events = Vec::new();
    let control = RequestControl::new();
    let round_loop = RoundLoop::new(&verifier, Some(&drafter), &Pieces);
    let stop = StopConditions::max_tokens(MAX_TOKENS);
    let mut future = Box::pin(round_loop.run(
        request(BlockSizeConfig::fixed(4), samplings()[0], stop),
        &mut events,
        &control,
    ));
    assert!(!poll_times(&mut future, 50), "round 2 never completes");
    assert_eq!(
        verifier.log().verifies.len(),
        2,
        "rounds 0 and 1 answered, round 2 pending"
    );
    drop(future);
    assert_eq!(verifier.log().released_detached, vec![SEQ]);
    assert!(verifier.log().released.is_empty());
    assert_eq!(drafter.log().closed_detached, vec![SESSION]);
    assert!(drafter.log().closed.is_empty());
    assert_eq!(
        tokens_of(&events).len(),
        9,
        "prefill token and two rounds of 4"
    );
}

#[test]
fn load_cap_makes_rounds_plain_and_the_drafter_catches_up() {
    let sampling = samplings()[1];
    let reference = reference_decode(&PROMPT, &sampling, MAX_TOKENS, &[]);
    let verifier = TableVerifier::default();
    let drafter = TableDrafter::new(Policy::Oracle);
    let control = RequestControl::new();
    let mut sink = ReactingSink {
        events: Vec::new(),
        control: control.clone(),
        on_event: |seen: usize, control: &RequestControl| match seen {
            2 => control.set_block_cap(Some(1)),
            5 => control.set_block_cap(Some(2)),
            7 => control.set_block_cap(None),
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
    assert!(finish.stats.fallback.is_none());
    let widths: Vec<usize> = verifier.widths();
    assert_eq!(&widths[..8], &[4, 1, 1, 1, 2, 2, 4, 4], "{widths:?}");
    assert!(verifier.log().verifies.iter().all(|v| v.want_carry));
    let log = drafter.log();
    assert!(log.inconsistencies.is_empty(), "{:?}", log.inconsistencies);
    // The first draft after the plain rounds ships their carries along with its own round's.
    let after_cap = log.drafts.iter().find(|d| d.round == 4).unwrap();
    assert_eq!(after_cap.carries, 4);
    assert_eq!(
        finish.stats.accepted, finish.stats.drafted,
        "the mirror stayed exact"
    );
}
