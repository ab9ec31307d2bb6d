//! The batch scheduler's handle: callers enqueue work and await answers; the model runs on
//! the scheduler's own thread, never on the caller's (or the async runtime's) thread.

use std::future::Future;
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Instant;

use specd_core::{PrefillRequest, Prefilled, SeqId, Verified, Verifier, VerifyRequest};
use tokio::sync::oneshot;

use super::config::BatchConfig;
use super::counters::{BatchStats, Counters};
use super::drafting::DraftingRounds;
use super::jobs::{Job, PrefillJob, RowAnswer, TruncateJob, VerifyJob};
use super::worker;
use crate::carry::TargetCarry;
use crate::error::VerifierError;
use crate::local::LocalVerifier;
use crate::target::TargetModel;

/// Coalesces verify rounds of different sequences arriving close together into one batched
/// forward, and prefills prompts in bounded pieces between those forwards. Every answer is
/// the one [`LocalVerifier`] gives for the same sequence alone.
pub struct BatchVerifier<T: TargetModel> {
    local: Arc<LocalVerifier<T>>,
    config: BatchConfig,
    counters: Arc<Counters>,
    jobs: Sender<Job>,
}

/// A prefill admitted and queued; awaiting it gives its result. Dropping it before the
/// prefill finished gives the sequence up.
pub type PendingPrefill =
    std::pin::Pin<Box<dyn Future<Output = Result<Prefilled<TargetCarry>, VerifierError>> + Send>>;

impl<T: TargetModel> BatchVerifier<T> {
    /// Starts the worker thread. It ends once this handle is dropped and its work is done.
    pub fn new(local: Arc<LocalVerifier<T>>, config: BatchConfig) -> Self {
        Self::beside(local, config, None)
    }

    /// [`Self::new`] beside a drafter in the same process whose rounds `drafting` counts:
    /// rows waiting for company also wait for the sequences drafting now.
    pub fn beside(
        local: Arc<LocalVerifier<T>>,
        config: BatchConfig,
        drafting: Option<DraftingRounds>,
    ) -> Self {
        let config = BatchConfig {
            max_rows: config.max_rows.max(1),
            ..config
        };
        let counters = Arc::new(Counters::default());
        let (jobs, receiver) = mpsc::channel();
        let worker_local = local.clone();
        let thread_counters = counters.clone();
        // Like `std::thread::spawn`, only an OS out of threads fails here.
        std::thread::Builder::new()
            .name("specd-verify-batch".into())
            .spawn(move || worker::run(worker_local, config, drafting, thread_counters, receiver))
            .expect("the OS could not start the verify batch thread");
        Self {
            local,
            config,
            counters,
            jobs,
        }
    }

    pub fn local(&self) -> &Arc<LocalVerifier<T>> {
        &self.local
    }

    pub fn config(&self) -> BatchConfig {
        self.config
    }

    /// Batches run, largest batch, queue depth and more, as of now.
    pub fn stats(&self) -> BatchStats {
        self.counters.snapshot()
    }

    /// Verify rows waiting for a forward.
    pub fn queue_depth(&self) -> usize {
        self.counters.snapshot().queue_depth
    }

    /// Live sequences.
    pub fn active_sequences(&self) -> usize {
        self.local.sequence_count()
    }

    /// Bytes of K/V held by every live sequence.
    pub fn kv_bytes(&self) -> usize {
        self.local.kv_bytes()
    }

    /// Checks and admits a prefill at once (a full K/V budget is RESOURCE_EXHAUSTED here,
    /// never a wait), then queues it. `max_new_tokens` sizes the reservation; `None`
    /// reserves the whole context.
    pub fn start_prefill(
        &self,
        request: PrefillRequest,
        max_new_tokens: Option<usize>,
    ) -> Result<PendingPrefill, VerifierError> {
        self.local.admit(&request, max_new_tokens)?;
        let seq = request.seq;
        let (reply, answer) = oneshot::channel();
        if self
            .jobs
            .send(Job::Prefill(PrefillJob { request, reply }))
            .is_err()
        {
            self.local.release_sync(seq);
            return Err(VerifierError::Stopped);
        }
        Ok(Box::pin(async move {
            answer.await.map_err(|_| VerifierError::Stopped)?
        }))
    }

    /// Queues one verify row and awaits its answer. Dropping the future before the row's
    /// forward removes the row; the sequence is then as if the round was never sent.
    pub fn verify_row(
        &self,
        request: VerifyRequest,
    ) -> impl Future<Output = Result<RowAnswer, VerifierError>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let job = VerifyJob {
            request,
            reply,
            queued_at: Instant::now(),
            span: specd_telemetry::propagation::current_span_context(),
        };
        self.counters.enqueued();
        let sent = self.jobs.send(Job::Verify(job));
        if sent.is_err() {
            self.counters.dequeued(1);
        }
        async move {
            sent.map_err(|_| VerifierError::Stopped)?;
            answer.await.map_err(|_| VerifierError::Stopped)?
        }
    }

    /// Shrinks a sequence between forwards.
    pub fn truncate_row(
        &self,
        seq: SeqId,
        committed_len: usize,
    ) -> impl Future<Output = Result<(), VerifierError>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let sent = self.jobs.send(Job::Truncate(TruncateJob {
            seq,
            committed_len,
            reply,
        }));
        async move {
            sent.map_err(|_| VerifierError::Stopped)?;
            answer.await.map_err(|_| VerifierError::Stopped)?
        }
    }

    /// Frees a sequence and returns its K/V reservation; a forward in flight finishes on its
    /// own handle first.
    pub fn release_sync(&self, seq: SeqId) -> bool {
        let (released, record) = self.local.detach(seq);
        if released {
            // The batch that answered the sequence's last round may still hold its lock:
            // its K/V is handed to the prefix cache on the worker, after that batch.
            let leave_behind = record.map(|handle| {
                let local = self.local.clone();
                Box::new(move || local.leave_behind(handle)) as Box<dyn FnOnce() + Send>
            });
            let _ = self.jobs.send(Job::Released(leave_behind));
        }
        released
    }
}

impl<T: TargetModel> Verifier for BatchVerifier<T> {
    type Carry = TargetCarry;
    type Error = VerifierError;

    fn prefill(
        &self,
        request: PrefillRequest,
    ) -> impl Future<Output = Result<Prefilled<TargetCarry>, VerifierError>> + Send {
        let pending = self.start_prefill(request, None);
        async move { pending?.await }
    }

    fn verify(
        &self,
        request: VerifyRequest,
    ) -> impl Future<Output = Result<Verified<TargetCarry>, VerifierError>> + Send {
        let row = self.verify_row(request);
        async move { row.await.map(|row| row.answer.verified) }
    }

    fn truncate(
        &self,
        seq: SeqId,
        committed_len: usize,
    ) -> impl Future<Output = Result<(), VerifierError>> + Send {
        self.truncate_row(seq, committed_len)
    }

    fn release(&self, seq: SeqId) -> impl Future<Output = Result<(), VerifierError>> + Send {
        let _ = self.release_sync(seq);
        std::future::ready(Ok(()))
    }

    fn release_detached(&self, seq: SeqId) {
        let _ = self.release_sync(seq);
    }
}
