//! What the scheduler has done so far, readable while it runs and recorded as the metrics
//! of the telemetry contract (a no-op while no recorder is installed).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use specd_telemetry::record;

/// The `service` label of the verifier's queue depth.
const SERVICE: &str = "verifier";

/// A snapshot of the scheduler's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Batched verify forwards run.
    pub batches_run: u64,
    /// Rows over every batched forward.
    pub rows_run: u64,
    /// Rows of the largest batched forward.
    pub largest_batch_rows: usize,
    /// Verify rows waiting for a forward right now.
    pub queue_depth: usize,
    /// Prefill pieces run.
    pub prefill_chunks_run: u64,
    /// Prefill pieces that ran in a verify forward, beside its rows.
    pub prefill_pieces_joined: u64,
    /// Verify rows dropped before their forward because the caller went away.
    pub cancelled_rows: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    batches_run: AtomicU64,
    rows_run: AtomicU64,
    largest_batch_rows: AtomicUsize,
    queue_depth: AtomicUsize,
    prefill_chunks_run: AtomicU64,
    prefill_pieces_joined: AtomicU64,
    cancelled_rows: AtomicU64,
}

impl Counters {
    pub fn enqueued(&self) {
        let depth = self.queue_depth.fetch_add(1, Ordering::Relaxed) + 1;
        record::queue_depth(SERVICE, depth);
    }

    /// Rows that left the queue, into a forward or dropped.
    pub fn dequeued(&self, rows: usize) {
        let depth = self.queue_depth.fetch_sub(rows, Ordering::Relaxed) - rows;
        record::queue_depth(SERVICE, depth);
    }

    pub fn cancelled(&self) {
        self.cancelled_rows.fetch_add(1, Ordering::Relaxed);
    }

    pub fn batch_ran(&self, rows: usize) {
        record::verify_batch_rows(rows);
        self.batches_run.fetch_add(1, Ordering::Relaxed);
        self.rows_run.fetch_add(rows as u64, Ordering::Relaxed);
        self.largest_batch_rows.fetch_max(rows, Ordering::Relaxed);
    }

    pub fn prefill_chunk_ran(&self) {
        self.prefill_chunks_run.fetch_add(1, Ordering::Relaxed);
    }

    pub fn prefill_piece_joined(&self) {
        self.prefill_pieces_joined.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> BatchStats {
        BatchStats {
            batches_run: self.batches_run.load(Ordering::Relaxed),
            rows_run: self.rows_run.load(Ordering::Relaxed),
            largest_batch_rows: self.largest_batch_rows.load(Ordering::Relaxed),
            queue_depth: self.queue_depth.load(Ordering::Relaxed),
            prefill_chunks_run: self.prefill_chunks_run.load(Ordering::Relaxed),
            prefill_pieces_joined: self.prefill_pieces_joined.load(Ordering::Relaxed),
            cancelled_rows: self.cancelled_rows.load(Ordering::Relaxed),
        }
    }
}
