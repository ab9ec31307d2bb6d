//! Open sessions and their round bookkeeping.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tonic::Status;

use super::status::unknown_session;

/// What identifies a draft request within its round, so a retry can be told from a
/// conflicting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepKey {
    pub bonus: u32,
    pub position: u32,
    pub count: u32,
    pub output_index_base: u32,
}

/// One session: the engine state and the rounds applied to it.
pub(crate) struct SessionEntry<S> {
    pub session: S,
    /// Last round whose carry was applied (0 right after Open).
    pub applied_round: u64,
    /// Drafts of the applied round, once drafted.
    pub answer: Option<(StepKey, Vec<u32>)>,
    pub last_used: Instant,
}

pub(crate) type SharedEntry<S> = Arc<Mutex<SessionEntry<S>>>;

/// Every open session of one server.
pub(crate) struct Sessions<S> {
    table: Mutex<HashMap<u64, SharedEntry<S>>>,
    next_id: AtomicU64,
}

/// Locks session state; a panic mid-round leaves the round unanswered, which a retry redoes,
/// so a poisoned lock is still usable.
pub(crate) fn lock<X>(mutex: &Mutex<X>) -> MutexGuard<'_, X> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<S> Sessions<S> {
    pub fn new() -> Self {
        Self {
            table: Mutex::default(),
            next_id: AtomicU64::new(1),
        }
    }

    pub fn len(&self) -> usize {
        lock(&self.table).len()
    }

    /// Adds a session unless `max` are open already; returns its id.
    pub fn insert(&self, session: S, max: usize) -> Result<u64, Status> {
        let mut table = lock(&self.table);
        if table.len() >= max {
            return Err(full(max));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = SessionEntry {
            session,
            applied_round: 0,
            answer: None,
            last_used: Instant::now(),
        };
        table.insert(id, Arc::new(Mutex::new(entry)));
        specd_telemetry::record::drafter_sessions(table.len());
        Ok(id)
    }

    /// RESOURCE_EXHAUSTED when `max` sessions are open.
    pub fn check_room(&self, max: usize) -> Result<(), Status> {
        if self.len() >= max {
            return Err(full(max));
        }
        Ok(())
    }

    pub fn get(&self, id: u64) -> Result<SharedEntry<S>, Status> {
        lock(&self.table)
            .get(&id)
            .cloned()
            .ok_or_else(|| unknown_session(id))
    }

    pub fn remove(&self, id: u64) -> bool {
        let mut table = lock(&self.table);
        let removed = table.remove(&id).is_some();
        specd_telemetry::record::drafter_sessions(table.len());
        removed
    }

    /// Sessions not used for `timeout` and not in use right now.
    pub fn idle(&self, timeout: Duration) -> Vec<u64> {
        let entries: Vec<(u64, SharedEntry<S>)> = lock(&self.table)
            .iter()
            .map(|(id, entry)| (*id, entry.clone()))
            .collect();
        entries
            .into_iter()
            .filter(|(_, entry)| match entry.try_lock() {
                Ok(entry) => entry.last_used.elapsed() >= timeout,
                Err(_) => false,
            })
            .map(|(id, _)| id)
            .collect()
    }
}

fn full(max: usize) -> Status {
    Status::resource_exhausted(format!("the drafter holds its maximum of {max} sessions"))
}
