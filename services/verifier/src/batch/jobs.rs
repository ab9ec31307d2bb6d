//! Work handed to the scheduler's worker thread, each with the channel its answer goes to.

use std::time::Instant;

use specd_core::{PrefillRequest, Prefilled, SeqId, VerifyRequest};
use specd_telemetry::propagation::SpanContext;
use tokio::sync::oneshot;

use crate::carry::TargetCarry;
use crate::error::VerifierError;
use crate::local::RoundAnswer;

/// A verify row's answer, as the sequence recorded it.
#[derive(Debug, Clone)]
pub struct RowAnswer {
    pub answer: RoundAnswer,
    /// The stored answer of an earlier identical request (a retry), not a new forward.
    pub replayed: bool,
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
    /// A sequence was released: wakes the worker to update the occupancy metrics, and
    /// leaves its K/V in the prefix cache there, once no batch holds it.
    Released(Option<Box<dyn FnOnce() + Send>>),
}
