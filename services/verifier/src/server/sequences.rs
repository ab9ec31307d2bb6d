//! The server's view of each sequence: round bookkeeping next to the model cache that the
//! [`LocalVerifier`] holds, run through the [`BatchVerifier`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use specd_core::SeqId;
use specd_wire::ids::WireId;
use specd_wire::verifier::VerifyResponse;
use tonic::Status;

use super::status::unknown_sequence;
use crate::batch::BatchVerifier;
use crate::local::LocalVerifier;
use crate::target::TargetModel;

/// The answer of the last applied round, replayed to a retry.
pub(crate) struct Replay {
    pub tokens: Vec<u32>,
    pub response: VerifyResponse,
}

/// Per-sequence protocol state.
pub(crate) struct SeqWire {
    /// The sequence ships hidden states and K/V deltas to an MTP drafter.
    pub with_mtp_state: bool,
    /// Last applied round (0 after prefill).
    pub last_round: u64,
    /// Tokens in the target cache.
    pub committed_len: u32,
    /// First sliding row of the drafter's mirror, as the snapshot and deltas so far left it;
    /// the next delta evicts up to the verifier's own first sliding row.
    pub mirror_sliding_start: u32,
    pub last_answer: Option<Replay>,
    pub last_used: Instant,
}

/// A live sequence: the model's id for its cache, and its protocol state.
#[derive(Clone)]
pub(crate) struct SeqEntry {
    pub seq: SeqId,
    pub state: Arc<Mutex<SeqWire>>,
}

/// Every live sequence of one server, by the random id its client holds (the model's own
/// ids are counters, never shown to clients).
pub(crate) struct Sequences<T: TargetModel> {
    batch: Arc<BatchVerifier<T>>,
    table: DashMap<WireId, SeqEntry>,
    next_id: AtomicU64,
}

impl<T: TargetModel> Sequences<T> {
    pub fn new(batch: Arc<BatchVerifier<T>>) -> Self {
        Self {
            batch,
            table: DashMap::new(),
            next_id: AtomicU64::new(1),
        }
    }

    pub fn local(&self) -> &LocalVerifier<T> {
        self.batch.local()
    }

    /// The scheduler every model run goes through.
    pub fn batch(&self) -> &BatchVerifier<T> {
        &self.batch
    }

    pub fn batch_handle(&self) -> Arc<BatchVerifier<T>> {
        self.batch.clone()
    }

    /// A fresh model id for a new sequence, never reused by this process.
    pub fn allocate(&self) -> SeqId {
        SeqId(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Makes `seq` live under `id`, the id its client will hold.
    pub fn insert(&self, id: WireId, seq: SeqId, state: SeqWire) {
        let state = Arc::new(Mutex::new(state));
        self.table.insert(id, SeqEntry { seq, state });
    }

    /// The sequence `seq_id` names: INVALID_ARGUMENT when it is no id, NOT_FOUND when no
    /// such sequence is live.
    pub fn entry(&self, seq_id: &str) -> Result<SeqEntry, Status> {
        let id = WireId::parse("seq_id", seq_id)?;
        self.table
            .get(&id)
            .map(|entry| entry.value().clone())
            .ok_or_else(|| unknown_sequence(seq_id))
    }

    /// Frees the sequence `seq_id` names; false when it was not live.
    pub fn release_id(&self, seq_id: &str) -> Result<bool, Status> {
        let id = WireId::parse("seq_id", seq_id)?;
        let entry = self.table.remove(&id).map(|(_, entry)| entry);
        Ok(match entry {
            Some(entry) => {
                self.batch.release_sync(entry.seq);
                true
            }
            None => false,
        })
    }

    /// Frees the sequence's cache and state; false when neither was held.
    pub fn release(&self, seq: SeqId) -> bool {
        let had_state = {
            let ids: Vec<WireId> = self
                .table
                .iter()
                .filter(|entry| entry.value().seq == seq)
                .map(|entry| *entry.key())
                .collect();
            let mut removed = false;
            for id in ids {
                removed |= self.table.remove(&id).is_some();
            }
            removed
        };
        let had_cache = self.batch.release_sync(seq);
        had_state || had_cache
    }

    /// Sequences not used for `timeout` and not in use right now.
    pub fn idle(&self, timeout: Duration) -> Vec<SeqId> {
        let entries: Vec<SeqEntry> = self
            .table
            .iter()
            .map(|entry| entry.value().clone())
            .collect();
        entries
            .into_iter()
            .filter(|entry| match entry.state.try_lock() {
                Ok(state) => state.last_used.elapsed() >= timeout,
                Err(_) => false,
            })
            .map(|entry| entry.seq)
            .collect()
    }
}

/// Releases a sequence by id; the prefill stream holds one without knowing the target type.
pub(crate) trait ReleaseSequence: Send + Sync {
    fn release_sequence(&self, seq: SeqId) -> bool;
}

impl<T: TargetModel> ReleaseSequence for Sequences<T> {
    fn release_sequence(&self, seq: SeqId) -> bool {
        self.release(seq)
    }
}
