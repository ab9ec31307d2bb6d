//! Caller-side handle on a running request: cancellation and a block-size cap.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

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
}

impl RequestControl {
    /// A fresh control: not cancelled, no cap.
    pub fn new() -> Self {
        Self::default()
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

    /// The current cap.
    pub fn block_cap(&self) -> Option<usize> {
        match self.state.block_cap.load(Ordering::Relaxed) {
            0 => None,
            encoded => Some(encoded - 1),
        }
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
