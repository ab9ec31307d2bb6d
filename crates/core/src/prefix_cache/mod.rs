//! A cache of token prefixes and the model state (K/V) computed for them, so that a new
//! sequence whose prompt starts with a cached prefix prefills only the rest.
//!
//! The cache is model-free: it holds whatever state `C` the caller computed for a token
//! sequence, and the caller says, through a [`PrefixRule`], how much of a cached sequence a
//! new one may start from so that it computes exactly what a cold prefill would. Entries are
//! looked up by the longest usable common prefix within one [`CacheScope`], bounded in bytes,
//! and evicted least recently used first. An entry is owned by the cache alone: a sequence
//! that reuses it gets a copy of the prefix (see [`PrefixCache::lookup_with`]), so nothing a
//! running sequence uses is ever evicted.

mod counters;
mod rule;

use std::sync::Mutex;

pub use counters::{PrefixCacheCounters, PrefixCacheTotals};
pub use rule::{CacheScope, PrefixRule};

use crate::sync::lock;

/// Entries a lookup tries to copy from, longest usable prefix first, before it gives up.
pub const COPY_ATTEMPTS: usize = 8;

/// One cached token sequence and its state.
struct Entry<C> {
    scope: CacheScope,
    tokens: Vec<u32>,
    /// Leading positions computed by the prompt's prefill (the rest by decoding rounds).
    prefilled: usize,
    state: C,
    bytes: usize,
    /// Lookup tick of the last use, for least-recently-used eviction.
    last_used: u64,
}

struct Inner<C> {
    entries: Vec<Entry<C>>,
    bytes: usize,
    tokens: usize,
    tick: u64,
}

/// What a lookup found: the state's prefix was handed to the caller's copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixHit<R> {
    /// Prompt tokens the copied state covers.
    pub tokens: usize,
    /// What the caller's copy returned.
    pub copied: R,
}

/// Token prefixes and their state, bounded in bytes (see the module docs).
pub struct PrefixCache<C> {
    inner: Mutex<Inner<C>>,
    max_bytes: usize,
    rule: PrefixRule,
    counters: PrefixCacheCounters,
}

/// Tokens `a` and `b` share from their start.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<C> PrefixCache<C> {
    /// A cache of at most `max_bytes` (0 keeps nothing) whose reuse follows `rule`.
    pub fn new(max_bytes: usize, rule: PrefixRule) -> Self {
        Self {
            inner: Mutex::new(Inner {
                entries: Vec::new(),
                bytes: 0,
                tokens: 0,
                tick: 0,
            }),
            max_bytes,
            rule,
            counters: PrefixCacheCounters::default(),
        }
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    pub fn rule(&self) -> PrefixRule {
        self.rule
    }

    /// Whether anything can ever be cached.
    pub fn is_enabled(&self) -> bool {
        self.max_bytes > 0 && self.rule != PrefixRule::Never
    }

    pub fn counters(&self) -> &PrefixCacheCounters {
        &self.counters
    }

    /// Bytes and token positions held now.
    pub fn held(&self) -> (usize, usize) {
        let inner = lock(&self.inner);
        (inner.bytes, inner.tokens)
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        lock(&self.inner).entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Prompt positions a new sequence may take from a state of `tokens` (the first
    /// `prefilled` of them from a prefill), under this cache's rule.
    pub fn usable(&self, tokens: &[u32], prefilled: usize, prompt: &[u32]) -> usize {
        self.rule
            .usable(common_prefix(tokens, prompt), prefilled, prompt.len())
    }

    /// Finds the entry of `scope` holding the longest usable prefix of `prompt`, longer than
    /// `at_least`, and runs `copy(state, len)` on it under the cache's lock (so the entry
    /// cannot be evicted meanwhile). `copy` returns `None` when it cannot take that prefix
    /// (a state that no longer holds every row the prefix needs); the next longest is tried
    /// then, up to [`COPY_ATTEMPTS`]. Every call counts as one lookup.
    pub fn lookup_with<R>(
        &self,
        scope: &CacheScope,
        prompt: &[u32],
        at_least: usize,
        mut copy: impl FnMut(&C, usize) -> Option<R>,
    ) -> Option<PrefixHit<R>> {
        self.counters.lookup();
        if !self.is_enabled() {
            return None;
        }
        let mut inner = lock(&self.inner);
        let candidates = self.candidates(&inner, scope, prompt, at_least);
        for (index, len) in candidates.into_iter().take(COPY_ATTEMPTS) {
            let Some(copied) = copy(&inner.entries[index].state, len) else {
                continue;
            };
            inner.tick += 1;
            let tick = inner.tick;
            inner.entries[index].last_used = tick;
            self.counters.hit(len);
            return Some(PrefixHit {
                tokens: len,
                copied,
            });
        }
        None
    }

    /// Takes the entry of `scope` holding the longest usable prefix of `prompt`, longer than
    /// `at_least`, out of the cache: its state and the prompt tokens it serves. Where any
    /// prefix of a state is reusable, moving it into the new sequence (which leaves it
    /// behind again, longer, when it ends) saves copying it; a sequence that shares the
    /// prefix meanwhile copies it from that running one. Counts as one lookup.
    pub fn take(&self, scope: &CacheScope, prompt: &[u32], at_least: usize) -> Option<(C, usize)> {
        self.counters.lookup();
        if !self.is_enabled() {
            return None;
        }
        let mut inner = lock(&self.inner);
        let (index, len) = *self.candidates(&inner, scope, prompt, at_least).first()?;
        let entry = inner.remove(index);
        self.counters.hit(len);
        Some((entry.state, len))
    }

    /// A state holding the longest usable prefix of `prompt` (longer than `at_least`) for a
    /// new sequence of `scope`, and its length: where any prefix of a state is reusable the
    /// entry is taken out and `truncate`d to it (no copy), otherwise `copy` makes one
    /// (see [`Self::lookup_with`]). `truncate` returns false when it cannot.
    pub fn reuse(
        &self,
        scope: &CacheScope,
        prompt: &[u32],
        at_least: usize,
        truncate: impl FnOnce(&mut C, usize) -> bool,
        copy: impl FnMut(&C, usize) -> Option<C>,
    ) -> Option<(C, usize)> {
        if self.rule == PrefixRule::AnyLength {
            let (mut state, len) = self.take(scope, prompt, at_least)?;
            return truncate(&mut state, len).then_some((state, len));
        }
        self.lookup_with(scope, prompt, at_least, copy)
            .map(|hit| (hit.copied, hit.tokens))
    }

    /// The entries of `scope` with a usable prefix of `prompt` longer than `at_least`, as
    /// (index, usable length), longest first (the older entry first among equals).
    fn candidates(
        &self,
        inner: &Inner<C>,
        scope: &CacheScope,
        prompt: &[u32],
        at_least: usize,
    ) -> Vec<(usize, usize)> {
        let mut candidates: Vec<(usize, usize)> = inner
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| &e.scope == scope)
            .map(|(i, e)| (i, self.usable(&e.tokens, e.prefilled, prompt)))
            .filter(|&(_, len)| len > at_least)
            .collect();
        candidates.sort_by_key(|&(i, len)| (std::cmp::Reverse(len), i));
        candidates
    }

    /// Keeps `state`, the model state of `tokens` (the first `prefilled` from a prefill),
    /// taking `bytes`, within `room` more bytes than the cache holds now (the rest of a
    /// shared memory budget; `usize::MAX` when only the cache's own bound applies). Entries
    /// whose every usable prefix the new one also offers are dropped; then the least
    /// recently used go until the cache fits. Returns false, dropping `state`, when it does
    /// not fit at all.
    pub fn insert(
        &self,
        scope: CacheScope,
        tokens: Vec<u32>,
        prefilled: usize,
        state: C,
        bytes: usize,
        room: usize,
    ) -> bool {
        if !self.is_enabled() || tokens.is_empty() {
            return false;
        }
        let mut inner = lock(&self.inner);
        let limit = self.max_bytes.min(inner.bytes.saturating_add(room));
        if bytes > limit {
            return false;
        }
        // An entry that is a prefix of the new one, and no more prefilled, offers nothing
        // the new one does not, where any prefix of a state is reusable; otherwise (a
        // sliding window drops rows a shorter prefix needs) only one of the same tokens.
        let any_length = self.rule == PrefixRule::AnyLength;
        let covered: Vec<usize> = inner
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.scope == scope
                    && e.prefilled.min(e.tokens.len()) <= prefilled
                    && (e.tokens.len() == tokens.len() || any_length)
                    && e.tokens.len() <= tokens.len()
                    && common_prefix(&e.tokens, &tokens) == e.tokens.len()
            })
            .map(|(i, _)| i)
            .collect();
        for i in covered.into_iter().rev() {
            inner.remove(i);
        }
        while inner.bytes + bytes > limit {
            if !self.evict_one(&mut inner) {
                return false;
            }
        }
        inner.tick += 1;
        let tick = inner.tick;
        inner.bytes += bytes;
        inner.tokens += tokens.len();
        inner.entries.push(Entry {
            scope,
            tokens,
            prefilled,
            state,
            bytes,
            last_used: tick,
        });
        true
    }

    /// Evicts least recently used entries until at least `bytes` were freed or none is
    /// left; returns the bytes freed.
    pub fn free_bytes(&self, bytes: usize) -> usize {
        let mut inner = lock(&self.inner);
        let before = inner.bytes;
        while before - inner.bytes < bytes {
            if !self.evict_one(&mut inner) {
                break;
            }
        }
        before - inner.bytes
    }

    /// Evicts least recently used entries until at least `tokens` positions were freed or
    /// none is left.
    pub fn free_tokens(&self, tokens: usize) {
        let mut inner = lock(&self.inner);
        let before = inner.tokens;
        while before - inner.tokens < tokens {
            if !self.evict_one(&mut inner) {
                break;
            }
        }
    }

    /// Drops every entry.
    pub fn clear(&self) {
        let mut inner = lock(&self.inner);
        while self.evict_one(&mut inner) {}
    }

    fn evict_one(&self, inner: &mut Inner<C>) -> bool {
        let oldest = inner
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.last_used)
            .map(|(i, _)| i);
        match oldest {
            Some(i) => {
                inner.remove(i);
                self.counters.evicted();
                true
            }
            None => false,
        }
    }
}

impl<C> Inner<C> {
    fn remove(&mut self, index: usize) -> Entry<C> {
        let entry = self.entries.swap_remove(index);
        self.bytes -= entry.bytes;
        self.tokens -= entry.tokens.len();
        entry
    }
}

#[cfg(test)]
mod tests;
