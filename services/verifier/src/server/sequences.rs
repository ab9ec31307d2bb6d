//! The server's map from the ids its clients hold to the sequences of the
//! [`LocalVerifier`], whose one record per sequence holds the cache and the round protocol
//! state; every model run goes through the [`BatchVerifier`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use specd_core::SeqId;
use specd_wire::ids::WireId;
use tonic::Status;

use super::status::unknown_sequence;
use crate::batch::BatchVerifier;
use crate::local::{LocalVerifier, SequenceHandle};
use crate::target::TargetModel;

/// Every live sequence of one server, by the random id its client holds (the model's own
/// ids are counters, never shown to clients).
pub(crate) struct Sequences<T: TargetModel> {
    batch: Arc<BatchVerifier<T>>,
    ids: DashMap<WireId, SeqId>,
    next_id: AtomicU64,
}

impl<T: TargetModel> Sequences<T> {
    pub fn new(batch: Arc<BatchVerifier<T>>) -> Self {
        Self {
            batch,
            ids: DashMap::new(),
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

    /// Makes the prefilled `seq` reachable under `id`, the id its client will hold.
    pub fn insert(&self, id: WireId, seq: SeqId) {
        self.ids.insert(id, seq);
    }

    /// The sequence `seq_id` names and its record: INVALID_ARGUMENT when it is no id,
    /// NOT_FOUND when no such sequence is live.
    pub fn entry(&self, seq_id: &str) -> Result<(SeqId, SequenceHandle<T::Cache>), Status> {
        let id = WireId::parse("seq_id", seq_id)?;
        let seq = self
            .ids
            .get(&id)
            .map(|entry| *entry.value())
            .ok_or_else(|| unknown_sequence(seq_id))?;
        let record = self
            .local()
            .sequence(seq)
            .map_err(|_| unknown_sequence(seq_id))?;
        Ok((seq, record))
    }

    /// Frees the sequence `seq_id` names; false when it was not live.
    pub fn release_id(&self, seq_id: &str) -> Result<bool, Status> {
        let id = WireId::parse("seq_id", seq_id)?;
        Ok(match self.ids.remove(&id) {
            Some((_, seq)) => {
                self.batch.release_sync(seq);
                true
            }
            None => false,
        })
    }

    /// Frees the sequence's record and its client id; false when neither was held.
    pub fn release(&self, seq: SeqId) -> bool {
        let mut had_id = false;
        self.ids.retain(|_, held| {
            let matches = *held == seq;
            had_id |= matches;
            !matches
        });
        let had_record = self.batch.release_sync(seq);
        had_id || had_record
    }

    /// Sequences not used for `timeout` and not in use right now.
    pub fn idle(&self, timeout: Duration) -> Vec<SeqId> {
        self.local().idle(timeout)
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

impl<T: TargetModel> specd_wire::idle::IdleWork for Sequences<T> {
    type Id = SeqId;
    const NAME: &'static str = "sequence";

    fn live(&self) -> usize {
        self.local().sequence_count()
    }

    fn idle(&self, timeout: Duration) -> Vec<SeqId> {
        Sequences::idle(self, timeout)
    }

    fn expire(&self, seq: SeqId) -> bool {
        self.release(seq)
    }
}
