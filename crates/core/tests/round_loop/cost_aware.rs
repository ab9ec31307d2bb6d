//! The cost-aware block size switches speculation off and back on mid-request, with measured
//! costs on tokio's paused clock, and the output stays exactly the plain output.

use std::sync::Arc;
use std::time::Duration;

use specd_core::{
    BlockSizeConfig, Event, EventSink, FinishReason, ForwardCost, GovernedRound, OpenCost,
    RequestControl, RoundLoop, SamplingParams, SpecStats, SpeculationGovernor, StopConditions,
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
    tree_nodes: 0,
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

/// A governor that has seen a compute-bound verifier (each token of a forward costs as much
/// as a third of a step) and one drafter: under load, plain rows batch better.
fn loaded_governor() -> Arc<SpeculationGovernor> {
    let governor = Arc::new(SpeculationGovernor::new(1, CONFIG.requested));
    for tokens in [2, 4, 8, 16, 32] {
        governor.record(&GovernedRound {
            forward: Some(ForwardCost {
                tokens,
                rows: 2,
                time: Duration::from_millis(60 + 30 * tokens as u64),
            }),
            ..GovernedRound::default()
        });
    }
    for _ in 0..20 {
        governor.record(&GovernedRound {
            draft: Some((3, Duration::from_millis(90), 1)),
            forward: None,
            verify_time: Duration::ZERO,
            drafted: 3,
            accepted: 2,
        });
    }
    governor
}

#[tokio::test(start_paused = true)]
async fn the_governor_runs_plain_under_load_and_speculates_when_it_lifts() {
    const MAX_TOKENS: usize = 80;
    const LOAD_ENDS_AFTER_EVENTS: usize = 20;
    let costs = Costs {
        base: Duration::from_millis(10),
        per_token: Duration::ZERO,
        per_step: Duration::from_millis(1),
    };
    for sampling in samplings() {
        let case = format!("{sampling:?}");
        let governor = loaded_governor();
        governor.set_active(4);
        assert_eq!(governor.cap(), Some(1), "{case}");
        let verifier = TableVerifier::default();
        let drafter = TableDrafter::new(Policy::Oracle);
        let control = RequestControl::governed(governor.clone());
        let mut sink = ReactingSink {
            events: Vec::new(),
            control: control.clone(),
            on_event: |seen: usize, control: &RequestControl| {
                if seen == LOAD_ENDS_AFTER_EVENTS {
                    if let Some(governor) = control.governor() {
                        governor.set_active(1);
                    }
                }
            },
        };
        let outcome = run_timed_into(
            &verifier, &drafter, &costs, sampling, MAX_TOKENS, &mut sink, &control,
        )
        .await;
        let stats = check_lossless(&sink.events, outcome, &drafter, &sampling, MAX_TOKENS);
        let lifted_from = tokens_of(&sink.events[..LOAD_ENDS_AFTER_EVENTS]).len() as u64;
        let log = verifier.log();
        let widths = |lifted: bool| {
            log.verifies
                .iter()
                .filter(move |v| (v.output_index_base >= lifted_from) == lifted)
                .map(|v| v.tokens.len())
        };
        assert!(widths(false).all(|w| w == 1), "{case}: plain under load");
        assert!(widths(true).any(|w| w == 4), "{case}: speculating again");
        assert!(
            stats.speculation_off_rounds >= LOAD_ENDS_AFTER_EVENTS as u64 - 1,
            "{case}: {stats:?}"
        );
        // The session stayed open: the first draft after the load caught up on the carries.
        assert_eq!(drafter.log().opens.len(), 1, "{case}");
        assert!(drafter.log().drafts.first().is_some_and(|d| d.carries > 1));
    }
}

#[tokio::test(start_paused = true)]
async fn the_governor_declines_a_drafter_a_short_request_cannot_pay_back() {
    let costs = Costs {
        base: Duration::from_millis(10),
        per_token: Duration::ZERO,
        per_step: Duration::from_millis(1),
    };
    for sampling in samplings() {
        let case = format!("{sampling:?}");
        let governor = loaded_governor();
        governor.set_active(1);
        // Opening prefills the prompt on the drafter at a second per token.
        governor.record_open(&OpenCost::cold(100, Duration::from_secs(100)));
        let verifier = TableVerifier::default();
        let drafter = TableDrafter::new(Policy::Oracle);
        let control = RequestControl::governed(governor.clone());
        let mut events = Vec::new();
        let outcome = run_timed_into(
            &verifier,
            &drafter,
            &costs,
            sampling,
            12,
            &mut events,
            &control,
        )
        .await;
        let stats = check_lossless(&events, outcome, &drafter, &sampling, 12);
        assert_eq!(stats.drafted, 0, "{case}");
        assert!(drafter.log().opens.is_empty(), "{case}: no session opened");
        assert!(stats.speculation_off_rounds > 0, "{case}: {stats:?}");
        // A request that fixed its block size is not governed.
        let fixed = BlockSizeConfig::fixed(4);
        let stop = StopConditions::max_tokens(12);
        let mut events = Vec::new();
        let finish = RoundLoop::new(&verifier, Some(&drafter), &Pieces)
            .run(request(fixed, sampling, stop), &mut events, &control)
            .await
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert!(finish.stats.drafted > 0, "{case}");
    }
}

/// One greedy request of `max_tokens` governed by `control`: its stats and how many sessions
/// the drafter opened.
async fn run_opening(
    verifier: &TableVerifier,
    drafter: &TableDrafter,
    max_tokens: usize,
    control: &RequestControl,
) -> (SpecStats, usize) {
    let costs = Costs {
        base: Duration::from_millis(10),
        per_token: Duration::ZERO,
        per_step: Duration::from_millis(1),
    };
    let greedy = SamplingParams::GREEDY;
    let mut events = Vec::new();
    let outcome = run_timed_into(
        verifier,
        drafter,
        &costs,
        greedy,
        max_tokens,
        &mut events,
        control,
    )
    .await;
    let stats = check_lossless(&events, outcome, drafter, &greedy, max_tokens);
    (stats, drafter.log().opens.len())
}

#[tokio::test(start_paused = true)]
async fn an_open_is_priced_on_the_prompt_tokens_the_drafter_computes() {
    const MAX_TOKENS: usize = 40;
    let cached = PROMPT.len() - 1;
    let warm_verifier = || TableVerifier::with_cached_prompt(cached);
    let governor = loaded_governor();
    governor.set_active(1);
    // Opening prefills on the drafter at a second a token: the whole prompt costs more than
    // speculation saves over 40 tokens (about 1.9 s), its last token less.
    governor.record_open(&OpenCost::cold(100, Duration::from_secs(100)));
    let control = RequestControl::governed(governor.clone());
    let cold = TableDrafter::new(Policy::Oracle);
    let (stats, opens) = run_opening(&TableVerifier::default(), &cold, MAX_TOKENS, &control).await;
    assert_eq!((stats.drafted, opens), (0, 0), "a cold prompt is declined");
    // The verifier's prefix cache held all but the last token, and so did the drafter's.
    for turn in ["first", "second"] {
        let holding = TableDrafter::holding(Policy::Oracle, cached);
        let (stats, opens) = run_opening(&warm_verifier(), &holding, MAX_TOKENS, &control).await;
        assert_eq!(opens, 1, "{turn}: {stats:?}");
        assert!(stats.drafted > 0, "{turn}: {stats:?}");
    }
    // A drafter that takes in every position however much the verifier held (an MTP
    // snapshot): the first such open teaches that the cache saves it nothing.
    let fresh = loaded_governor();
    fresh.set_active(1);
    fresh.record_open(&OpenCost::cold(100, Duration::from_secs(100)));
    let control = RequestControl::governed(fresh);
    let snapshot = TableDrafter::new(Policy::Oracle);
    let (_, opens) = run_opening(&warm_verifier(), &snapshot, MAX_TOKENS, &control).await;
    assert_eq!(
        opens, 1,
        "cached tokens are taken to be held until an open says"
    );
    let snapshot = TableDrafter::new(Policy::Oracle);
    let (stats, opens) = run_opening(&warm_verifier(), &snapshot, MAX_TOKENS, &control).await;
    assert_eq!(
        (stats.drafted, opens),
        (0, 0),
        "then priced on the whole prompt"
    );
}
