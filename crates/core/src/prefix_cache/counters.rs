//! What a prefix cache did, for metrics and Stats.

use std::sync::atomic::{AtomicU64, Ordering};

/// Running totals since the cache was made.
#[derive(Debug, Default)]
pub struct PrefixCacheCounters {
    lookups: AtomicU64,
    hits: AtomicU64,
    hit_tokens: AtomicU64,
    evictions: AtomicU64,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheTotals {
    pub lookups: u64,
    pub hits: u64,
    pub hit_tokens: u64,
    pub evictions: u64,
}

impl PrefixCacheCounters {
    pub(crate) fn lookup(&self) {
        self.lookups.fetch_add(1, Ordering::Relaxed);
    }

    pub fn hit(&self, tokens: usize) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.hit_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
    }

    pub(crate) fn evicted(&self) {
        self.evictions.fetch_add(1, Ordering::Relaxed);
    }

    pub fn totals(&self) -> PrefixCacheTotals {
        PrefixCacheTotals {
            lookups: self.lookups.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
            hit_tokens: self.hit_tokens.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }
}
