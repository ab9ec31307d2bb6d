//! Recording helpers for the services; a no-op until [`crate::init`] installs a recorder.

use std::time::Duration;

use crate::names;

/// Which end of an RPC measured a duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

impl Side {
    fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Server => "server",
        }
    }
}

/// Direction of wire bytes, seen from the process that counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Sent,
    Received,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::Sent => "sent",
            Direction::Received => "received",
        }
    }
}

pub fn draft_duration(side: Side, elapsed: Duration) {
    metrics::histogram!(names::DRAFT_DURATION, "side" => side.as_str()).record(elapsed);
}

pub fn verify_duration(side: Side, elapsed: Duration) {
    metrics::histogram!(names::VERIFY_DURATION, "side" => side.as_str()).record(elapsed);
}

/// Protobuf bytes of one message of `rpc` (`verify`, `draft`, ...).
pub fn wire_bytes(rpc: &'static str, direction: Direction, bytes: usize) {
    metrics::counter!(names::WIRE_BYTES, "rpc" => rpc, "direction" => direction.as_str())
        .increment(bytes as u64);
}

/// Rows served by one verifier forward.
pub fn verify_batch_rows(rows: usize) {
    metrics::histogram!(names::VERIFY_BATCH_ROWS).record(rows as f64);
}

/// Work waiting in `service` (`router` or `verifier`).
pub fn queue_depth(service: &'static str, depth: usize) {
    metrics::gauge!(names::QUEUE_DEPTH, "service" => service).set(depth as f64);
}

pub fn active_sequences(count: usize) {
    metrics::gauge!(names::ACTIVE_SEQUENCES).set(count as f64);
}

pub fn kv_bytes(bytes: usize) {
    metrics::gauge!(names::KV_BYTES).set(bytes as f64);
}

/// The running totals of `service`'s (`verifier` or `drafter`) prefix cache.
pub fn prefix_cache(
    service: &'static str,
    bytes: usize,
    totals: specd_core::prefix_cache::PrefixCacheTotals,
) {
    let label = ("service", service);
    metrics::gauge!(names::PREFIX_CACHE_BYTES, &[label]).set(bytes as f64);
    metrics::counter!(names::PREFIX_CACHE_HIT_TOKENS, &[label]).absolute(totals.hit_tokens);
    metrics::counter!(names::PREFIX_CACHE_LOOKUPS, &[label]).absolute(totals.lookups);
    metrics::counter!(names::PREFIX_CACHE_EVICTIONS, &[label]).absolute(totals.evictions);
}

pub fn drafter_sessions(count: usize) {
    metrics::gauge!(names::DRAFTER_SESSIONS).set(count as f64);
}

/// Speculation switched on (`true`) or off by a policy.
pub fn speculation_switch(on: bool) {
    let to = if on { "on" } else { "off" };
    metrics::counter!(names::SPECULATION_SWITCHES, "to" => to).increment(1);
}

/// A request continued without speculation (`cause` as in the contract).
pub fn fallback(cause: &'static str) {
    metrics::counter!(names::FALLBACKS, "cause" => cause).increment(1);
}

/// A round that asked for the drafter's pre-draft found it usable (`hit`) or not.
pub fn predraft(hit: bool, branch: bool) {
    let outcome = match (hit, branch) {
        (true, true) => "branch_hit",
        (true, false) => "hit",
        (false, _) => "miss",
    };
    metrics::counter!(names::PREDRAFTS, "outcome" => outcome).increment(1);
}

/// The router decided to pre-draft (overlap drafting with verifying) or to stop.
pub fn overlap_switch(on: bool) {
    let to = if on { "on" } else { "off" };
    metrics::counter!(names::OVERLAP_SWITCHES, "to" => to).increment(1);
}

/// A request moved to another verifier replica.
pub fn verifier_migration() {
    metrics::counter!(names::VERIFIER_MIGRATIONS).increment(1);
}

/// Counts one request in flight for as long as it lives.
#[must_use = "the request counts as active only while the guard lives"]
pub struct ActiveRequest(());

impl ActiveRequest {
    pub fn start() -> Self {
        metrics::gauge!(names::ACTIVE_REQUESTS).increment(1.0);
        Self(())
    }
}

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        metrics::gauge!(names::ACTIVE_REQUESTS).decrement(1.0);
    }
}
