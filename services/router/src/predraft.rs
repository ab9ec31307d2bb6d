//! How a request's pre-drafts went: a hit is a round that started from the drafts the
//! drafter made while the previous round was verified; a miss, one that had to draft anew.

use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Debug, Default)]
pub struct PredraftCounts {
    hits: AtomicU32,
    misses: AtomicU32,
}

impl PredraftCounts {
    pub fn record(&self, hit: bool) {
        let counter = if hit { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        specd_telemetry::record::predraft(hit);
    }

    pub fn hits(&self) -> u32 {
        self.hits.load(Ordering::Relaxed)
    }

    pub fn misses(&self) -> u32 {
        self.misses.load(Ordering::Relaxed)
    }
}
