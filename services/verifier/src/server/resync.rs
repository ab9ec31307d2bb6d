//! Snapshot and Truncate: bringing a drafter or the router back in line with a sequence.

use std::time::Instant;

use specd_wire::kv::snapshot_chunks;
use specd_wire::SnapshotChunk;
use tonic::Status;

use super::convert::{position, snapshot_of};
use super::sequences::Sequences;
use super::status::status_of;
use crate::target::TargetModel;
use specd_core::sync::lock;

impl<T: TargetModel> Sequences<T> {
    /// The shared-K/V snapshot at the current committed length, chunked. A drafter opened
    /// from it starts a fresh mirror, so later deltas evict relative to it. Blocking.
    pub fn snapshot(&self, seq_id: &str, chunk_bytes: usize) -> Result<Vec<SnapshotChunk>, Status> {
        let (_, record) = self.entry(seq_id)?;
        let mut record = lock(&record);
        record.last_used = Instant::now();
        let (len, shared) = self.local().shared_kv_of(&record).map_err(status_of)?;
        let shared = shared.ok_or_else(|| {
            Status::failed_precondition("seq_id: this target exports no shared K/V")
        })?;
        let snapshot = snapshot_of(position(len, "committed_len")?, &shared)?;
        let chunks = snapshot_chunks(&snapshot, chunk_bytes)?;
        record.rounds.mirror_sliding_start = snapshot.sliding_start as usize;
        Ok(chunks)
    }

    /// Rolls the sequence back to `committed_len` tokens. The last round can no longer be
    /// replayed afterwards. Blocking.
    pub fn truncate(&self, seq_id: &str, committed_len: u32) -> Result<u32, Status> {
        let (_, record) = self.entry(seq_id)?;
        let mut record = lock(&record);
        record.last_used = Instant::now();
        let held = self.local().len_of(&record);
        if committed_len == 0 || committed_len as usize > held {
            return Err(Status::out_of_range(format!(
                "committed_len: must be in 1..={held}, got {committed_len}"
            )));
        }
        self.local()
            .truncate_record(&mut record, committed_len as usize)
            .map_err(|error| match error {
                crate::VerifierError::Model(model) => {
                    Status::failed_precondition(format!("committed_len: {model}"))
                }
                other => status_of(other),
            })?;
        Ok(committed_len)
    }
}
