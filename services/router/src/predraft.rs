//! How a request's pre-drafts went: a hit is a round that started from the drafts the
//! drafter made while the previous round was verified (a branch hit, from those it made
//! for a rejection); a miss, one that had to draft anew.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use specd_wire::placement::Placement;

use crate::overlap::Overlap;
use crate::verifiers::VerifierPool;

/// What a request asks of its drafter's pre-drafts, and where it counts how they went.
#[derive(Clone)]
pub struct Predrafting {
    pub counts: Arc<PredraftCounts>,
    /// Rejection branches per pre-draft besides the all-accepted one.
    pub branches: u32,
    /// Whether each draft call asks for a pre-draft, and what the rounds measured.
    pub overlap: Arc<Overlap>,
    /// The verifier replicas, whose placements tell whether a drafter shares their cores.
    pub verifiers: Arc<VerifierPool>,
}

impl Predrafting {
    /// Whether a drafter placed at `drafter` runs on a verifier's cores: `None` when either
    /// side did not say.
    pub fn shares_cores(&self, drafter: Option<&Placement>) -> Option<bool> {
        let drafter = drafter?;
        let verifiers = self.verifiers.placements();
        let mut known = verifiers
            .iter()
            .filter_map(|verifier| drafter.shares_cores_with(verifier))
            .peekable();
        known.peek()?;
        Some(known.any(|shares| shares))
    }
}

#[derive(Debug, Default)]
pub struct PredraftCounts {
    hits: AtomicU32,
    branch_hits: AtomicU32,
    misses: AtomicU32,
    switches: AtomicU32,
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

    /// The request's pre-drafting went on or off between two of its draft calls.
    pub fn switched(&self) {
        self.switches.fetch_add(1, Ordering::Relaxed);
    }

    /// Times the request's pre-drafting went on or off.
    pub fn switches(&self) -> u32 {
        self.switches.load(Ordering::Relaxed)
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
