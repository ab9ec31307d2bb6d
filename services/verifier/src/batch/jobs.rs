//! Work handed to the scheduler's worker thread, each with the channel its answer goes to.

use std::time::Instant;

use specd_core::{PrefillRequest, Prefilled, SeqId, Verified, VerifyRequest};
use specd_telemetry::propagation::SpanContext;
use tokio::sync::oneshot;

use crate::carry::TargetCarry;
use crate::error::VerifierError;

/// A verify row's answer, with what the gRPC layer needs to keep a drafter's mirror in line.
#[derive(Debug, Clone)]
pub struct RowAnswer {
    pub verified: Verified<TargetCarry>,
    /// First position of the sliding shared K/V after the round, when asked for a carry and
    /// the target exports one.
    pub sliding_start: Option<usize>,
}

pub(crate) struct VerifyJob {
    pub request: VerifyRequest,
    pub reply: oneshot::Sender<Result<RowAnswer, VerifierError>>,
    pub queued_at: Instant,
    /// The caller's span, which the batched forward serving this row links to.
    pub span: SpanContext,
}

pub(crate) struct PrefillJob {
    /// Already admitted: its K/V reservation is held.
    pub request: PrefillRequest,
    pub reply: oneshot::Sender<Result<Prefilled<TargetCarry>, VerifierError>>,
}

pub(crate) struct TruncateJob {
    pub seq: SeqId,
    pub committed_len: usize,
    pub reply: oneshot::Sender<Result<(), VerifierError>>,
}

pub(crate) enum Job {
    Verify(VerifyJob),
    Prefill(PrefillJob),
    Truncate(TruncateJob),
    /// A sequence was released: wakes the worker to update the occupancy metrics.
    Released,
}
