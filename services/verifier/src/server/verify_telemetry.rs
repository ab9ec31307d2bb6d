//! What a Verify call records: wire bytes, server-side duration, and the round's counts on
//! the call's server span.
//!
//! Batching: the server span of the call is current while the row is enqueued; the
//! scheduler keeps its context with the row and gives the batched forward's `verify_batch`
//! span a link to every row it served (`services/verifier/src/batch/verify_batch.rs`).

use std::time::Instant;

use prost::Message as _;
use specd_telemetry::propagation::set_current_attribute;
use specd_telemetry::record::{self, Direction, Side};
use specd_wire::verifier::{VerifyRequest, VerifyResponse};

pub(super) fn received(request: &VerifyRequest) {
    record::wire_bytes("verify", Direction::Received, request.encoded_len());
    set_current_attribute("round", request.round as i64);
    set_current_attribute("block_size", request.tokens.len() as i64);
    set_current_attribute("drafted", request.tokens.len().saturating_sub(1) as i64);
}

pub(super) fn answered(response: &VerifyResponse, started: Instant) {
    let bytes = response.encoded_len();
    record::wire_bytes("verify", Direction::Sent, bytes);
    record::verify_duration(Side::Server, started.elapsed());
    set_current_attribute("accepted", i64::from(response.accepted));
    set_current_attribute("bytes", bytes as i64);
    set_current_attribute("rows", 1);
}
