//! The cost-aware block size switches speculation off and back on mid-request, with measured
//! costs on tokio's paused clock, and the output stays exactly the plain output.

use std::time::Duration;

use specd_core::{
    BlockSizeConfig, Event, EventSink, FinishReason, RequestControl, RoundLoop, SamplingParams,
    SpecStats, StopConditions,
};

use crate::support::pieces::Pieces;
use crate::support::scenario::{request, samplings, tokens_of, Outcome, PROMPT};
use crate::support::sinks::ReactingSink;
use crate::support::table_drafter::{Policy, TableDrafter};
use crate::support::table_target::reference_decode;
use crate::support::table_verifier::TableVerifier;
use crate::support::timed::{TimedDrafter, TimedVerifier, TokioClock};

const CONFIG: BlockSizeConfig = BlockSizeConfig {
    requested: 4,
    configured: 4,
    cost_aware: true,
};

/// Round costs: verify `base + per_token × tokens`, draft `per_step × drafts`.
struct Costs {
    base: Duration,
    per_token: Duration,
    per_step: Duration,
}

async fn run_timed(
    verifier: &TableVerifier,
    drafter: &TableDrafter,
    costs: &Costs,
    sampling: SamplingParams,
    max_tokens: usize,
) -> (Vec<Event>, Outcome) {
    let mut events = Vec::new();
    let control = RequestControl::new();
    let outcome = run_timed_into(
        verifier,
        drafter,
        costs,
        sampling,
        max_tokens,
        &mut events,
        &control,
    )
    .await;
    (events, outcome)
}

async fn run_timed_into<S: EventSink>(
    verifier: &TableVerifier,
    drafter: &TableDrafter,
    costs: &Costs,
    sampling: SamplingParams,
    max_tokens: usize,
    sink: &mut S,
    control: &RequestControl,
) -> Outcome {
    let verifier = TimedVerifier {
        inner: verifier,
        base: costs.base,
        per_token: costs.per_token,
    };
    let drafter = TimedDrafter {
        inner: drafter,
        per_step: costs.per_step,
    };
    let stop = StopConditions::max_tokens(max_tokens);
    RoundLoop::new(&verifier, Some(&drafter), &Pieces)
        .with_clock(&TokioClock)
        .run(request(CONFIG, sampling, stop), sink, control)
        .await
}

/// Output equals plain decoding, and the drafter always saw consistent carries.
fn check_lossless(
    events: &[Event],
    outcome: Outcome,
    drafter: &TableDrafter,
    sampling: &SamplingParams,
    max_tokens: usize,
) -> SpecStats {
    let case = format!("{sampling:?}");
    let finish = outcome.unwrap_or_else(|e| panic!("{case}: {e}"));
    let reference = reference_decode(&PROMPT, sampling, max_tokens, &[]);
    assert_eq!(tokens_of(events), reference, "{case}");
    assert_eq!(finish.reason, FinishReason::Length, "{case}");
    assert!(finish.stats.fallback.is_none(), "{case}");
    let log = drafter.log();
    assert!(
        log.inconsistencies.is_empty(),
        "{case}: {:?}",
        log.inconsistencies
    );
    finish.stats
}

#[tokio::test(start_paused = true)]
async fn speculation_goes_off_and_back_on_as_acceptance_changes() {
    const MAX_TOKENS: usize = 220;
    const BAD: (u64, u64) = (30, 120);
    let costs = Costs {
        base: Duration::from_millis(10),
        per_token: Duration::from_millis(2),
        per_step: Duration::from_millis(3),
    };
    for sampling in samplings() {
        let case = format!("{sampling:?}");
        let verifier = TableVerifier::default();
        let drafter = TableDrafter::new(Policy::AdversarialBetween {
            from: BAD.0,
            to: BAD.1,
        });
        let (events, outcome) = run_timed(&verifier, &drafter, &costs, sampling, MAX_TOKENS).await;
        let stats = check_lossless(&events, outcome, &drafter, &sampling, MAX_TOKENS);
        assert!(stats.speculation_switches >= 2, "{case}: {stats:?}");
        assert!(stats.speculation_off_rounds >= 8, "{case}: {stats:?}");

        let log = verifier.log();
        let speculative = |from: u64, to: u64| {
            log.verifies
                .iter()
                .filter(|v| (from..to).contains(&v.output_index_base) && v.tokens.len() > 1)
                .count()
        };
        let plain = |from: u64, to: u64| {
            log.verifies
                .iter()
                .filter(|v| (from..to).contains(&v.output_index_base) && v.tokens.len() == 1)
                .count()
        };
        // Off for most of the bad stretch: only a few rounds switching off, and probes, draft.
        assert!(speculative(BAD.0, BAD.1) <= 16, "{case}");
        assert!(plain(BAD.0, BAD.1) >= 60, "{case}");
        // Back on well before the end: the tail is mostly speculative rounds.
        let tail = MAX_TOKENS as u64 - 40;
        assert!(speculative(tail, MAX_TOKENS as u64) >= 8, "{case}");
        assert!(plain(tail, MAX_TOKENS as u64) == 0, "{case}");
        // A probe after plain rounds ships all their carries at once.
        assert!(drafter.log().drafts.iter().any(|call| call.carries > 1));
    }
}

#[tokio::test(start_paused = true)]
async fn slow_drafting_switches_speculation_off() {
    const MAX_TOKENS: usize = 120;
    let costs = Costs {
        base: Duration::from_millis(10),
        per_token: Duration::from_millis(1),
        per_step: Duration::from_millis(50),
    };
    for sampling in samplings() {
        let case = format!("{sampling:?}");
        let verifier = TableVerifier::default();
        let drafter = TableDrafter::new(Policy::Oracle);
        let (events, outcome) = run_timed(&verifier, &drafter, &costs, sampling, MAX_TOKENS).await;
        let stats = check_lossless(&events, outcome, &drafter, &sampling, MAX_TOKENS);
        assert_eq!(stats.speculation_switches, 1, "{case}: {stats:?}");
        assert!(
            stats.speculation_off_rounds * 10 >= stats.rounds * 9,
            "{case}: {stats:?}"
        );
        // Every draft is accepted, yet only the first rounds and the rare probes draft.
        let calls = drafter.log().drafts.len();
        assert!(calls <= 8, "{case}: {calls} draft calls");
        assert_eq!(stats.accepted, stats.drafted, "{case}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_load_cap_bounds_cost_aware_blocks() {
    const MAX_TOKENS: usize = 80;
    const CAPPED_AFTER_EVENTS: usize = 6;
    let costs = Costs {
        base: Duration::from_millis(10),
        per_token: Duration::ZERO,
        per_step: Duration::from_millis(1),
    };
    for sampling in samplings() {
        let case = format!("{sampling:?}");
        let verifier = TableVerifier::default();
        let drafter = TableDrafter::new(Policy::Oracle);
        let control = RequestControl::new();
        let mut sink = ReactingSink {
            events: Vec::new(),
            control: control.clone(),
            on_event: |seen: usize, control: &RequestControl| {
                if seen == CAPPED_AFTER_EVENTS {
                    control.set_block_cap(Some(2));
                }
            },
        };
        let outcome = run_timed_into(
            &verifier, &drafter, &costs, sampling, MAX_TOKENS, &mut sink, &control,
        )
        .await;
        check_lossless(&sink.events, outcome, &drafter, &sampling, MAX_TOKENS);
        let capped_from = tokens_of(&sink.events[..CAPPED_AFTER_EVENTS]).len() as u64;
        let log = verifier.log();
        let widths = |capped: bool| {
            log.verifies
                .iter()
                .filter(move |v| (v.output_index_base >= capped_from) == capped)
                .map(|v| v.tokens.len())
        };
        assert!(widths(false).any(|w| w == 4), "{case}: drafting pays");
        assert!(widths(true).all(|w| w <= 2), "{case}");
        assert!(widths(true).filter(|&w| w == 2).count() >= 20, "{case}");
    }
}
