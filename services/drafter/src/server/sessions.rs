//! Open sessions and their round bookkeeping.

use specd_core::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use specd_core::DraftTree;
use specd_wire::ids::WireId;
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
    pub tree_nodes: u32,
}

/// One session: the engine state and the rounds applied to it.
pub(crate) struct SessionEntry<S> {
    pub session: S,
    /// Last round whose carry was applied (0 right after Open).
    pub applied_round: u64,
    /// Drafts of the applied round, once drafted.
    pub answer: Option<(StepKey, DraftTree)>,
    pub last_used: Instant,
}

pub(crate) type SharedEntry<S> = Arc<Mutex<SessionEntry<S>>>;

/// Every open session of one server.
pub(crate) struct Sessions<S> {
    table: DashMap<WireId, SharedEntry<S>>,
    /// K/V positions each session holds, and their sum, against the budget. Opens and
    /// closes change it and the table together under its lock, so the session limit and
    /// the budget hold however many Opens run at once.
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    by_session: HashMap<WireId, usize>,
    total: usize,
}

impl Held {
    /// RESOURCE_EXHAUSTED unless a session holding `before` positions may hold `tokens`.
    fn check(&self, before: usize, tokens: usize, budget: Option<usize>) -> Result<(), Status> {
        let others = self.total - before;
        match budget {
            Some(budget) if others + tokens > budget && tokens > before => {
                Err(Status::resource_exhausted(format!(
                    "max_kv_tokens: {tokens} positions for this session do not fit the \
                     drafter's K/V budget of {budget} ({others} held by other sessions)"
                )))
            }
            _ => Ok(()),
        }
    }
}

impl<S> Sessions<S> {
    pub fn new() -> Self {
        Self {
            table: DashMap::new(),
            held: Mutex::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Adds a session holding `tokens` K/V positions unless `max` are open already or the
    /// positions do not fit `budget`; returns its id.
    pub fn insert(
        &self,
        session: S,
        max: usize,
        tokens: usize,
        budget: Option<usize>,
    ) -> Result<WireId, Status> {
        let mut held = lock(&self.held);
        if self.table.len() >= max {
            return Err(full(max));
        }
        held.check(0, tokens, budget)?;
        let id = WireId::random();
        held.by_session.insert(id, tokens);
        held.total += tokens;
        let entry = SessionEntry {
            session,
            applied_round: 0,
            answer: None,
            last_used: Instant::now(),
        };
        self.table.insert(id, Arc::new(Mutex::new(entry)));
        specd_telemetry::record::drafter_sessions(self.table.len());
        Ok(id)
    }

    /// RESOURCE_EXHAUSTED when `max` sessions are open.
    pub fn check_room(&self, max: usize) -> Result<(), Status> {
        if self.len() >= max {
            return Err(full(max));
        }
        Ok(())
    }

    /// The session `session_id` names, and its parsed id: INVALID_ARGUMENT when it is no
    /// id, NOT_FOUND when no such session is open.
    pub fn get(&self, session_id: &str) -> Result<(WireId, SharedEntry<S>), Status> {
        let id = WireId::parse("session_id", session_id)?;
        self.table
            .get(&id)
            .map(|entry| (id, entry.value().clone()))
            .ok_or_else(|| unknown_session(session_id))
    }

    /// Records that the session `id` now holds `tokens` K/V positions: RESOURCE_EXHAUSTED
    /// (and nothing changes) if that does not fit `budget`. A session closed meanwhile holds
    /// nothing.
    pub fn hold(&self, id: WireId, tokens: usize, budget: Option<usize>) -> Result<(), Status> {
        let mut held = lock(&self.held);
        let Some(&before) = held.by_session.get(&id) else {
            return Ok(());
        };
        held.check(before, tokens, budget)?;
        held.by_session.insert(id, tokens);
        held.total = held.total - before + tokens;
        Ok(())
    }

    pub fn remove(&self, id: WireId) -> bool {
        self.take(id).is_some()
    }

    /// Removes the session `id` and returns its entry.
    pub fn take(&self, id: WireId) -> Option<SharedEntry<S>> {
        let mut held = lock(&self.held);
        if let Some(tokens) = held.by_session.remove(&id) {
            held.total -= tokens;
        }
        let removed = self.table.remove(&id).map(|(_, entry)| entry);
        specd_telemetry::record::drafter_sessions(self.table.len());
        removed
    }

    /// Sessions not used for `timeout` and not in use right now.
    pub fn idle(&self, timeout: Duration) -> Vec<WireId> {
        let entries: Vec<(WireId, SharedEntry<S>)> = self
            .table
            .iter()
            .map(|entry| (*entry.key(), entry.value().clone()))
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

impl<S: Send + 'static> specd_wire::idle::IdleWork for Sessions<S> {
    type Id = WireId;
    const NAME: &'static str = "session";

    fn live(&self) -> usize {
        self.len()
    }

    fn idle(&self, timeout: Duration) -> Vec<WireId> {
        Sessions::idle(self, timeout)
    }

    fn expire(&self, id: WireId) -> bool {
        self.remove(id)
    }
}
