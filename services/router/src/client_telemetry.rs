//! Client spans and metrics of the router's Draft and Verify calls. Each call runs inside its
//! span, so the trace context the call carries (see `deadline::with_deadline`) makes the
//! drafter's or verifier's server span its child.

use std::time::Instant;

use prost::Message;
use specd_telemetry::record::{self, Direction, Side};
use specd_wire::drafter::DraftRequest;
use specd_wire::verifier::{VerifyRequest, VerifyResponse};
use tracing::field::Empty;
use tracing::Span;

/// The client span of one Verify (retries included).
pub(crate) fn verify_span(request: &VerifyRequest) -> Span {
    tracing::info_span!(
        "verify",
        otel.kind = "client",
        round = int(request.round),
        block_size = int(request.tokens.len() as u64),
        accepted = Empty,
        bytes = Empty,
    )
}

/// The client span of one Draft call.
pub(crate) fn draft_span(request: &DraftRequest) -> Span {
    tracing::info_span!(
        "draft",
        otel.kind = "client",
        round = int(request.round),
        count = i64::from(request.count),
        drafted = Empty,
        bytes = Empty,
    )
}

/// A Verify answered after `started`.
pub(crate) fn verified(
    span: &Span,
    request: &VerifyRequest,
    response: &VerifyResponse,
    started: Instant,
) {
    record::verify_duration(Side::Client, started.elapsed());
    let (sent, received) = (request.encoded_len(), response.encoded_len());
    record::wire_bytes("verify", Direction::Sent, sent);
    record::wire_bytes("verify", Direction::Received, received);
    span.record("accepted", i64::from(response.accepted));
    span.record("bytes", int((sent + received) as u64));
}

/// A Draft call answered with `drafts` after `started`.
pub(crate) fn drafted(
    span: &Span,
    request_bytes: usize,
    response_bytes: usize,
    drafts: usize,
    started: Instant,
) {
    record::draft_duration(Side::Client, started.elapsed());
    record::wire_bytes("draft", Direction::Sent, request_bytes);
    record::wire_bytes("draft", Direction::Received, response_bytes);
    span.record("drafted", int(drafts as u64));
    span.record("bytes", int((request_bytes + response_bytes) as u64));
}

/// Span attributes are signed in OpenTelemetry; an unsigned value would be exported as text.
fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
