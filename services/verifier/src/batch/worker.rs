//! The scheduler's worker thread: the only place the target model runs. Each iteration runs
//! at most one batched verify forward and at most one prefill chunk, so a long prompt never
//! stalls the rounds of running sequences, and rows join or leave between forwards. Where
//! the target computes every row of a forward anyway, the prefill pieces ride in the verify
//! forward (one pass over the weights for both; several short prompts share one chunk);
//! elsewhere one piece runs after it.

use std::collections::{HashSet, VecDeque};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use specd_core::SeqId;
use specd_telemetry::record;

use super::config::BatchConfig;
use super::counters::Counters;
use super::drafting::DraftingRounds;
use super::jobs::{Job, TruncateJob, VerifyJob};
use super::prefill_task::{Piece, PrefillTask};
use super::returns::Returns;
use super::verify_batch::{run_batch, take_rows};
use crate::local::LocalVerifier;
use crate::target::TargetModel;

/// While rows wait for company, how often the worker looks for callers that went away.
const CANCEL_CHECK: Duration = Duration::from_millis(5);

struct Worker<T: TargetModel> {
    local: Arc<LocalVerifier<T>>,
    config: BatchConfig,
    drafting: Option<DraftingRounds>,
    counters: Arc<Counters>,
    jobs: Receiver<Job>,
    /// The job sender still exists.
    open: bool,
    waiting: Vec<VerifyJob>,
    prefills: VecDeque<PrefillTask<T::Cache>>,
    returns: Returns,
}

/// Runs until the scheduler is dropped and every accepted job is answered.
pub(crate) fn run<T: TargetModel>(
    local: Arc<LocalVerifier<T>>,
    config: BatchConfig,
    drafting: Option<DraftingRounds>,
    counters: Arc<Counters>,
    jobs: Receiver<Job>,
) {
    let mut worker = Worker {
        local,
        config,
        drafting,
        counters,
        jobs,
        open: true,
        waiting: Vec::new(),
        prefills: VecDeque::new(),
        returns: Returns::default(),
    };
    while worker.next_iteration() {}
}

impl<T: TargetModel> Worker<T> {
    /// One verify forward and one prefill piece; false once there is nothing left to do.
    fn next_iteration(&mut self) -> bool {
        if self.waiting.is_empty() && self.prefills.is_empty() {
            match self.jobs.recv() {
                Ok(job) => self.accept(job),
                Err(_) => return false,
            }
        }
        self.drain();
        let joins = self.local.target().prefill_joins_blocks();
        if joins && self.waiting.is_empty() && !self.prefills.is_empty() {
            self.await_returning_rows();
        }
        if !self.waiting.is_empty() {
            self.gather();
            let rows = take_rows(&mut self.waiting, self.config.max_rows, &self.counters);
            let seqs: Vec<SeqId> = rows.iter().map(|job| job.request.seq).collect();
            let pieces = if joins {
                self.take_pieces()
            } else {
                Vec::new()
            };
            let started = Instant::now();
            let continuing = run_batch(&self.local, rows, pieces, &self.counters);
            let ended = Instant::now();
            self.returns.answered(seqs, ended, ended - started);
            self.requeue(continuing);
        } else if joins && !self.prefills.is_empty() {
            let pieces = self.take_pieces();
            let continuing = run_batch(&self.local, Vec::new(), pieces, &self.counters);
            self.requeue(continuing);
        }
        if !joins {
            if let Some(task) = self.prefills.pop_front() {
                if let Some(running) = task.step(&self.local, &self.counters) {
                    self.prefills.push_front(running);
                }
            }
        }
        self.record_occupancy();
        self.open || !self.waiting.is_empty() || !self.prefills.is_empty()
    }

    /// The next pieces of the prefills at the front, as many as fit in one prefill chunk
    /// together (the first always), to run in this iteration's forward: one pass over the
    /// weights serves the verify rows and the prompts.
    fn take_pieces(&mut self) -> Vec<(PrefillTask<T::Cache>, Piece)> {
        let budget = self.local.target().prefill_chunk_len().max(1);
        let mut pieces = Vec::new();
        let mut used = 0;
        while let Some(task) = self.prefills.pop_front() {
            let len = task.next_len(&self.local);
            if len == 0 {
                // Nothing to run: a piece alone says why.
                if let Some(running) = task.step(&self.local, &self.counters) {
                    self.prefills.push_front(running);
                }
                continue;
            }
            if !pieces.is_empty() && used + len > budget {
                self.prefills.push_front(task);
                break;
            }
            if let Some(taken) = task.next_piece(&self.local) {
                used += len;
                pieces.push(taken);
            }
        }
        pieces
    }

    /// Puts prefills with pieces left back at the front, in their order.
    fn requeue(&mut self, continuing: Vec<PrefillTask<T::Cache>>) {
        for task in continuing.into_iter().rev() {
            self.prefills.push_front(task);
        }
    }

    fn accept(&mut self, job: Job) {
        match job {
            Job::Verify(job) => {
                self.returns.arrived(job.request.seq, job.queued_at);
                self.waiting.push(job);
            }
            Job::Prefill(job) => {
                if let Some(task) = PrefillTask::start(&self.local, job) {
                    self.prefills.push_back(task);
                }
            }
            // Runs between forwards, so it never waits on a sequence lock held by a batch.
            Job::Truncate(TruncateJob {
                seq,
                committed_len,
                reply,
            }) => {
                let _ = reply.send(self.local.truncate_sync(seq, committed_len));
            }
            Job::Released(leave_behind) => {
                if let Some(leave_behind) = leave_behind {
                    leave_behind();
                }
            }
        }
    }

    /// Live sequences and the K/V they hold, for the occupancy gauges.
    fn record_occupancy(&self) {
        record::active_sequences(self.local.sequence_count());
        record::kv_bytes(self.local.kv_bytes());
        let prefixes = self.local.prefix_cache();
        record::prefix_cache("verifier", prefixes.held().0, prefixes.counters().totals());
    }

    /// Takes every job that already arrived.
    fn drain(&mut self) {
        loop {
            match self.jobs.try_recv() {
                Ok(job) => self.accept(job),
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.open = false;
                    return;
                }
            }
        }
    }

    /// Waits, from the oldest waiting row on, up to the configured time for more rows:
    /// until a forward would be full, or every live sequence has a row waiting (nobody else
    /// could join). It waits longer for rows of sequences expected straight back from their
    /// last answer (see [`Returns`]), and, while sequences draft beside it in this process,
    /// for their rows too, up to the drafting rounds' patience.
    fn gather(&mut self) {
        let Some(first) = self.waiting.iter().map(|job| job.queued_at).min() else {
            return;
        };
        let max_wait = self.config.max_wait;
        let mut deadline = first + max_wait;
        loop {
            self.drop_cancelled();
            let distinct = self.distinct_rows();
            if distinct == 0 {
                return;
            }
            let could_join = self.local.sequence_count().min(self.config.max_rows);
            if distinct >= could_join || !self.open {
                return;
            }
            let now = Instant::now();
            if let Some(drafting) = self.drafting.as_ref().filter(|d| d.now() > 0) {
                // A round drafting now verifies as soon as it is drafted.
                deadline = (now + max_wait).min(first + drafting.patience().max(max_wait));
            }
            let until = match self.returns.expected_by(now) {
                Some(expected) => deadline.max(expected),
                None => deadline,
            };
            if now >= until {
                return;
            }
            self.take_jobs_until(until, now);
        }
    }

    /// Before prefill pieces run without verify rows: waits for rows expected straight back
    /// from their last answer (see [`Returns`]), so they ride in the same forward instead of
    /// waiting for it and then running alone.
    fn await_returning_rows(&mut self) {
        while self.waiting.is_empty() && self.open {
            let now = Instant::now();
            let Some(until) = self.returns.expected_by(now) else {
                return;
            };
            self.take_jobs_until(until, now);
        }
    }

    /// Takes the jobs that arrive until `until` (at most [`CANCEL_CHECK`] from `now`).
    fn take_jobs_until(&mut self, until: Instant, now: Instant) {
        match self.jobs.recv_timeout((until - now).min(CANCEL_CHECK)) {
            Ok(job) => {
                self.accept(job);
                self.drain();
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => self.open = false,
        }
    }

    fn distinct_rows(&self) -> usize {
        let seqs: HashSet<SeqId> = self.waiting.iter().map(|job| job.request.seq).collect();
        seqs.len()
    }

    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|job| !job.reply.is_closed());
        for _ in self.waiting.len()..before {
            self.counters.dequeued(1);
            self.counters.cancelled();
        }
    }
}
