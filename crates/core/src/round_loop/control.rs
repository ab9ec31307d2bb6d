//! Caller-side handle on a running request: cancellation, a block-size cap, and the
//! process's speculation governor.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::block_size::SpeculationGovernor;

/// Shared control of one running request; clones refer to the same request.
#[derive(Clone, Debug, Default)]
pub struct RequestControl {
    state: Arc<ControlState>,
}

#[derive(Debug, Default)]
struct ControlState {
    cancelled: AtomicBool,
    /// Block-size cap plus one; 0 means no cap.
    block_cap: AtomicUsize,
    /// Shared by every request of the process: caps them all under load and learns from
    /// their rounds.
    governor: Option<Arc<SpeculationGovernor>>,
}

impl RequestControl {
    /// A fresh control: not cancelled, no cap.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fresh control whose rounds feed, and follow the cap of, `governor`.
    pub fn governed(governor: Arc<SpeculationGovernor>) -> Self {
        Self {
            state: Arc::new(ControlState {
                governor: Some(governor),
                ..ControlState::default()
            }),
        }
    }

    /// The process's governor, when the request has one.
    pub fn governor(&self) -> Option<&SpeculationGovernor> {
        self.state.governor.as_deref()
    }

    /// The process's governor as a shared handle, for a planner that outlives a borrow.
    pub(crate) fn governor_handle(&self) -> Option<Arc<SpeculationGovernor>> {
        self.state.governor.clone()
    }

    /// Asks the request to stop before its next round. It then finishes with
    /// [`crate::FinishReason::Cancelled`] and frees its verifier sequence and drafter session.
    pub fn cancel(&self) {
        self.state.cancelled.store(true, Ordering::Relaxed);
    }

    /// Whether [`Self::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.state.cancelled.load(Ordering::Relaxed)
    }

    /// Caps the block size from the next round on (for example under load); `None` lifts the
    /// cap. Rounds capped to 1 are plain, and the drafter still receives their carries.
    pub fn set_block_cap(&self, cap: Option<usize>) {
        let encoded = cap.map_or(0, |c| c.saturating_add(1));
        self.state.block_cap.store(encoded, Ordering::Relaxed);
    }

    /// The cap set with [`Self::set_block_cap`].
    pub fn block_cap(&self) -> Option<usize> {
        match self.state.block_cap.load(Ordering::Relaxed) {
            0 => None,
            encoded => Some(encoded - 1),
        }
    }

    /// The governor's cap for requests that leave their block size to specd (a request that
    /// fixed its block size keeps it).
    pub fn governed_cap(&self) -> Option<usize> {
        self.governor().and_then(SpeculationGovernor::cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_state() {
        let a = RequestControl::new();
        let b = a.clone();
        assert!(!b.is_cancelled());
        a.cancel();
        assert!(b.is_cancelled());
        assert_eq!(b.block_cap(), None);
        a.set_block_cap(Some(0));
        assert_eq!(b.block_cap(), Some(0));
        a.set_block_cap(Some(3));
        assert_eq!(b.block_cap(), Some(3));
        a.set_block_cap(None);
        assert_eq!(b.block_cap(), None);
    }
}
