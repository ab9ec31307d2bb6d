//! What the round loop tells tracing and metrics, in one place, so that the router and the
//! embedded `specd generate` record the same thing.
//!
//! Spans: `generate` around a request, `round` around each draft / verify / emit round (the
//! drafter's and verifier's own spans nest inside). Metrics go through the `metrics` facade
//! under the names of the telemetry contract; without an installed recorder they cost
//! nothing.

use std::future::Future;
use std::time::{Duration, Instant};

use tracing::field::Empty;
use tracing::{Instrument, Span};

use super::events::Finish;
use crate::fallback::FallbackCause;
pub(super) use crate::metric_names::{
    ACCEPTED_TOKENS, BLOCK_SIZE, DRAFTED_TOKENS, EMITTED_TOKENS, FALLBACKS, REQUESTS, ROUNDS,
    ROUND_DURATION, SPECULATION_SWITCHES, TIME_PER_OUTPUT_TOKEN, TIME_TO_FIRST_TOKEN,
};

/// The span of one request; the caller's span (a server span) is its parent.
pub(super) fn generate_span(prompt_tokens: usize, max_tokens: usize) -> Span {
    tracing::info_span!(
        "generate",
        prompt_tokens = int(prompt_tokens),
        max_tokens = int(max_tokens),
        cached_prompt_tokens = Empty,
        emitted = Empty,
        rounds = Empty,
        drafted = Empty,
        accepted = Empty,
        finish_reason = Empty,
    )
}

/// Runs one round inside its span and times it.
pub(super) async fn round<F: Future>(round: u32, body: F) -> F::Output {
    let span = tracing::info_span!(
        "round",
        round = i64::from(round),
        block_size = Empty,
        drafted = Empty,
        accepted = Empty,
        emitted = Empty,
    );
    let started = Instant::now();
    let output = body.instrument(span).await;
    metrics::histogram!(ROUND_DURATION).record(started.elapsed());
    output
}

/// The block size the controller chose for the current round.
pub(super) fn block_size(block_size: usize) {
    Span::current().record("block_size", int(block_size));
    metrics::histogram!(BLOCK_SIZE).record(block_size as f64);
}

/// A verified round: drafts at the positions `depths` (a tree's branches share theirs), of
/// which `accepted` were taken, one a position from the first.
pub(super) fn verified(drafter_kind: &'static str, depths: &[usize], accepted: usize) {
    let span = Span::current();
    span.record("drafted", int(depths.len()));
    span.record("accepted", int(accepted));
    metrics::counter!(ROUNDS, "drafter_kind" => drafter_kind).increment(1);
    for &position in depths {
        let label = position.to_string();
        metrics::counter!(DRAFTED_TOKENS, "position" => label.clone()).increment(1);
    }
    for position in 1..=accepted {
        let label = position.to_string();
        metrics::counter!(ACCEPTED_TOKENS, "position" => label).increment(1);
    }
}

/// Prompt tokens the verifier took from its prefix cache instead of prefilling them.
pub(super) fn prefilled(cached_prompt_tokens: usize) {
    Span::current().record("cached_prompt_tokens", int(cached_prompt_tokens));
}

/// Tokens one step (prefill or round) emitted.
pub(super) fn emitted(count: usize) {
    Span::current().record("emitted", int(count));
    metrics::counter!(EMITTED_TOKENS).increment(count as u64);
}

pub(super) fn fallback(cause: FallbackCause) {
    metrics::counter!(FALLBACKS, "cause" => cause.as_str()).increment(1);
}

/// A policy switched speculation on or off for a request.
pub(super) fn speculation_switch(on: bool) {
    let to = if on { "on" } else { "off" };
    metrics::counter!(SPECULATION_SWITCHES, "to" => to).increment(1);
}

/// Request-level timings: time to first token and time per output token.
pub(super) struct RequestTimer {
    started: Instant,
    first_token: Option<Duration>,
}

impl RequestTimer {
    pub(super) fn start() -> Self {
        Self {
            started: Instant::now(),
            first_token: None,
        }
    }

    pub(super) fn first_token(&mut self) {
        let elapsed = self.started.elapsed();
        self.first_token = Some(elapsed);
        metrics::histogram!(TIME_TO_FIRST_TOKEN).record(elapsed);
    }

    /// Records the request's outcome on its span and in the counters.
    pub(super) fn finished(&self, finish: &Finish) {
        let span = Span::current();
        span.record("emitted", int(finish.tokens_emitted));
        span.record("rounds", wide(finish.stats.rounds));
        span.record("drafted", wide(finish.stats.drafted));
        span.record("accepted", wide(finish.stats.accepted));
        span.record("finish_reason", finish.reason.as_str());
        metrics::counter!(REQUESTS, "finish_reason" => finish.reason.as_str()).increment(1);
        if let (Some(first), true) = (self.first_token, finish.tokens_emitted > 1) {
            let after_first = self.started.elapsed().saturating_sub(first);
            let later_tokens = u32::try_from(finish.tokens_emitted - 1).unwrap_or(u32::MAX);
            let per_token = after_first / later_tokens;
            metrics::histogram!(TIME_PER_OUTPUT_TOKEN).record(per_token);
        }
    }
}

/// Counts as span attributes: OpenTelemetry has signed integers only, and an unsigned value
/// would be exported as a string.
fn int(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn wide(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
