//! A drafter session that takes long to open (a draft model prefilling the prompt) delays
//! neither the first token nor the rounds: they run plain beside the open, and speculation
//! starts with the first round after it, the drafter catching up on every round it missed.

use std::time::Duration;

use specd_core::{
    BlockSizeConfig, DraftRequest, Drafter, Event, EventSink, FinishReason, OpenRequest, Opened,
    RequestControl, RoundLoop, SamplingParams, SessionId, StopConditions,
};

use crate::support::pieces::Pieces;
use crate::support::scenario::{request, samplings, tokens_of, PROMPT};
use crate::support::table_drafter::{Policy, TableDrafter, TableDrafterError};
use crate::support::table_target::reference_decode;
use crate::support::table_verifier::{Carry, TableVerifier};
use crate::support::timed::TimedVerifier;

const OPEN_TIME: Duration = Duration::from_millis(95);
const VERIFY_BASE: Duration = Duration::from_millis(10);

/// The table drafter whose open takes `open_time` on tokio's clock.
struct SlowOpen<'a> {
    inner: &'a TableDrafter,
    open_time: Duration,
}

impl Drafter for SlowOpen<'_> {
    type Carry = Carry;
    type Error = TableDrafterError;

    async fn open(&self, request: OpenRequest<Carry>) -> Result<Opened, TableDrafterError> {
        tokio::time::sleep(self.open_time).await;
        self.inner.open(request).await
    }

    async fn draft(&self, request: DraftRequest<Carry>) -> Result<Vec<u32>, TableDrafterError> {
        self.inner.draft(request).await
    }

    async fn close(&self, session: SessionId) -> Result<(), TableDrafterError> {
        self.inner.close(session).await
    }

    fn close_detached(&self, session: SessionId) {
        self.inner.close_detached(session);
    }
}

/// Every event with the tokio time it was sent at.
struct TimedSink {
    start: tokio::time::Instant,
    events: Vec<(Duration, Event)>,
}

impl EventSink for TimedSink {
    async fn send(&mut self, event: Event) -> Result<(), specd_core::round_loop::SinkClosed> {
        self.events.push((self.start.elapsed(), event));
        Ok(())
    }
}

async fn run(
    verifier: &TableVerifier,
    drafter: &TableDrafter,
    sampling: SamplingParams,
    max_tokens: usize,
) -> (TimedSink, specd_core::Finish) {
    let verifier = TimedVerifier {
        inner: verifier,
        base: VERIFY_BASE,
        per_token: Duration::ZERO,
    };
    let drafter = SlowOpen {
        inner: drafter,
        open_time: OPEN_TIME,
    };
    let mut sink = TimedSink {
        start: tokio::time::Instant::now(),
        events: Vec::new(),
    };
    let stop = StopConditions::max_tokens(max_tokens);
    let finish = RoundLoop::new(&verifier, Some(&drafter), &Pieces)
        .run(
            request(BlockSizeConfig::fixed(4), sampling, stop),
            &mut sink,
            &RequestControl::new(),
        )
        .await
        .unwrap();
    (sink, finish)
}

#[tokio::test(start_paused = true)]
async fn rounds_run_plain_beside_a_slow_open_then_speculate() {
    const MAX_TOKENS: usize = 40;
    for sampling in samplings() {
        let case = format!("{sampling:?}");
        let verifier = TableVerifier::default();
        let drafter = TableDrafter::new(Policy::Oracle);
        let (sink, finish) = run(&verifier, &drafter, sampling, MAX_TOKENS).await;

        let events: Vec<Event> = sink.events.iter().map(|(_, e)| e.clone()).collect();
        let reference = reference_decode(&PROMPT, &sampling, MAX_TOKENS, &[]);
        assert_eq!(tokens_of(&events), reference, "{case}");
        assert_eq!(finish.reason, FinishReason::Length, "{case}");
        assert!(finish.stats.fallback.is_none(), "{case}");

        // The first token goes out at once, not after the open.
        let (first_at, _) = &sink.events[0];
        assert!(*first_at < OPEN_TIME, "{case}: first token at {first_at:?}");
        // Plain rounds ran while the session opened, then every round drafted.
        let widths: Vec<usize> = verifier.widths();
        let plain = widths.iter().take_while(|&&w| w == 1).count();
        let expected_plain = (OPEN_TIME.as_millis() / VERIFY_BASE.as_millis()) as usize;
        assert!(
            (expected_plain..=expected_plain + 1).contains(&plain),
            "{case}: {widths:?}"
        );
        assert!(widths[plain..].iter().all(|&w| w > 1), "{case}: {widths:?}");
        // The first draft call brought the carries of every plain round.
        let log = drafter.log();
        assert!(
            log.inconsistencies.is_empty(),
            "{case}: {:?}",
            log.inconsistencies
        );
        assert_eq!(log.drafts[0].carries, plain, "{case}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_done_before_the_open_closes_the_session() {
    let verifier = TableVerifier::default();
    let drafter = TableDrafter::new(Policy::Oracle);
    let (sink, finish) = run(&verifier, &drafter, SamplingParams::GREEDY, 3).await;
    assert_eq!(finish.tokens_emitted, 3);
    assert!(sink.events.iter().all(|(at, _)| *at < OPEN_TIME));
    assert!(drafter.log().drafts.is_empty());
    assert_eq!(verifier.log().released.len(), 1);
    // The open never finished, so the session was never created; closing it is harmless.
    assert!(drafter.log().opens.is_empty());
}
