//! Rounds that draft beside the batch scheduler in the same process (the one-process
//! server). A sequence drafting now sends its verify as soon as its drafts are done, so a
//! forward whose rows wait for company waits for those rows too: concurrent requests then
//! verify together and draft together (a batched drafter drafts them in one forward per
//! step) instead of settling into turns where each request's verify runs alone while the
//! others draft, every forward competing with a drafter forward for the same cores.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How many rounds are drafting now; cloned by the drafter's side and the scheduler.
#[derive(Debug, Clone)]
pub struct DraftingRounds {
    drafting: Arc<AtomicUsize>,
    /// The longest a waiting row waits for drafting sequences to join it.
    patience: Duration,
}

/// One round drafting; the count drops when it is dropped.
#[derive(Debug)]
pub struct DraftingRound(Arc<AtomicUsize>);

impl Default for DraftingRounds {
    fn default() -> Self {
        Self::with_patience(DEFAULT_PATIENCE)
    }
}

impl DraftingRounds {
    pub fn with_patience(patience: Duration) -> Self {
        Self {
            drafting: Arc::new(AtomicUsize::new(0)),
            patience,
        }
    }

    /// A round starts drafting.
    pub fn start(&self) -> DraftingRound {
        self.drafting.fetch_add(1, Ordering::SeqCst);
        DraftingRound(self.drafting.clone())
    }

    /// Rounds drafting now.
    pub fn now(&self) -> usize {
        self.drafting.load(Ordering::SeqCst)
    }

    pub fn patience(&self) -> Duration {
        self.patience
    }
}

impl Drop for DraftingRound {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A few draft steps of a small model on a few cores; beyond it a verify runs without the
/// drafting rows (a stuck drafter never holds the others up for long).
const DEFAULT_PATIENCE: Duration = Duration::from_millis(250);
