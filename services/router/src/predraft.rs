//! How a request's pre-drafts went: a hit is a round that started from the drafts the
//! drafter made while the previous round was verified (a branch hit, from those it made
//! for a rejection); a miss, one that had to draft anew.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// What a request asks of its drafter's pre-drafts, and where it counts how they went.
#[derive(Debug, Clone)]
pub struct Predrafting {
    pub counts: Arc<PredraftCounts>,
    /// Rejection branches per pre-draft besides the all-accepted one.
    pub branches: u32,
}

#[derive(Debug, Default)]
pub struct PredraftCounts {
    hits: AtomicU32,
    branch_hits: AtomicU32,
    misses: AtomicU32,
}

impl PredraftCounts {
    pub fn record(&self, hit: bool, branch: bool) {
        let counter = if hit { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        if hit && branch {
            self.branch_hits.fetch_add(1, Ordering::Relaxed);
        }
        specd_telemetry::record::predraft(hit, branch);
    }

    /// Hits from rejection branches (counted among the hits too).
    pub fn branch_hits(&self) -> u32 {
        self.branch_hits.load(Ordering::Relaxed)
    }

    pub fn hits(&self) -> u32 {
        self.hits.load(Ordering::Relaxed)
    }

    pub fn misses(&self) -> u32 {
        self.misses.load(Ordering::Relaxed)
    }
}
