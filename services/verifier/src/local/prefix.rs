//! The prefix cache seen from the verifier: a new sequence starts from the longest prefix of
//! its prompt that a cached or a live sequence of its scope holds, and a released sequence
//! leaves its K/V behind. The reused rows are the bits a cold prefill computes (the target's
//! [`PrefixRule`] says which rows those are), so every later logit is too.

use specd_core::{CacheScope, PrefixRule};
use tracing::debug;

use super::*;

/// A new sequence's cache and the prompt positions it already holds.
pub(crate) struct SeededCache<C> {
    pub cache: C,
    pub cached: usize,
}

impl<T: TargetModel> LocalVerifier<T> {
    /// A cache for `request`'s prompt, holding the longest reusable prefix found (or
    /// nothing).
    pub(crate) fn seeded_cache(
        &self,
        request: &PrefillRequest,
    ) -> Result<SeededCache<T::Cache>, VerifierError> {
        if self.prefixes.is_enabled() {
            if let Some(seeded) = self.reuse_prefix(&request.cache_scope, &request.prompt_ids) {
                debug!(seq = %request.seq, cached = seeded.cached, "prompt prefix reused");
                return Ok(seeded);
            }
        }
        Ok(SeededCache {
            cache: self.target.new_cache()?,
            cached: 0,
        })
    }

    fn reuse_prefix(&self, scope: &CacheScope, prompt: &[u32]) -> Option<SeededCache<T::Cache>> {
        let live = self.longest_live_prefix(scope, prompt);
        let live_len = live.as_ref().map_or(0, |(len, _)| *len);
        let cached = self.prefixes.reuse(
            scope,
            prompt,
            live_len,
            |cache, len| self.target.truncate(cache, len).is_ok(),
            |state, len| self.target.cache_prefix(state, len).ok().flatten(),
        );
        if let Some((cache, cached)) = cached {
            return Some(SeededCache { cache, cached });
        }
        let (len, handle) = live?;
        // A running sequence that shares the prompt's start (requests with one system prompt
        // arriving together): copy from it under its lock, between its rounds.
        let record = lock(&handle);
        if self.target.cache_len(&record.cache) < len {
            return None;
        }
        let cache = self
            .target
            .cache_prefix(&record.cache, len)
            .ok()
            .flatten()?;
        self.prefixes.counters().hit(len);
        Some(SeededCache { cache, cached: len })
    }

    /// The live sequence of `scope` with the longest usable prefix of `prompt`; one busy in
    /// a forward right now is passed over rather than waited for.
    fn longest_live_prefix(
        &self,
        scope: &CacheScope,
        prompt: &[u32],
    ) -> Option<(usize, SequenceHandle<T::Cache>)> {
        let handles: Vec<SequenceHandle<T::Cache>> = self
            .sequences
            .iter()
            .map(|entry| entry.value().clone())
            .collect();
        let mut best: Option<(usize, SequenceHandle<T::Cache>)> = None;
        for handle in handles {
            let len = {
                let Ok(record) = handle.try_lock() else {
                    continue;
                };
                if &record.scope != scope {
                    continue;
                }
                let held = self
                    .target
                    .cache_len(&record.cache)
                    .min(record.tokens.len());
                self.prefixes
                    .usable(&record.tokens[..held], record.prefilled, prompt)
            };
            if len > best.as_ref().map_or(0, |(l, _)| *l) {
                best = Some((len, handle));
            }
        }
        best
    }

    /// Where prompt rows match a cold prefill only in whole chunks, keeps the cache as it
    /// stands after `done` prompt tokens (a chunk boundary): the sequence's later rows are
    /// computed otherwise, and its sliding layers drop rows a later prompt would need.
    pub(crate) fn keep_prefill_boundary(
        &self,
        request: &PrefillRequest,
        cache: &T::Cache,
        done: usize,
    ) {
        let PrefixRule::PrefillChunks(chunk) = self.prefixes.rule() else {
            return;
        };
        if !self.prefixes.is_enabled() || done == 0 || !done.is_multiple_of(chunk.max(1)) {
            return;
        }
        let Some(prompt) = request.prompt_ids.get(..done) else {
            return;
        };
        if let Ok(Some(snapshot)) = self.target.cache_prefix(cache, done) {
            let bytes = self.target.cache_bytes(&snapshot);
            self.prefixes.insert(
                request.cache_scope.clone(),
                prompt.to_vec(),
                done,
                snapshot,
                bytes,
                self.room_in_budget(),
            );
        }
    }

    /// A released sequence's K/V goes to the prefix cache, unless a forward of it is in
    /// flight right now or its rows could seed nothing a prompt-boundary copy does not.
    pub(crate) fn leave_behind(&self, handle: SequenceHandle<T::Cache>) {
        if !self.prefixes.is_enabled() || self.prefixes.rule() != PrefixRule::AnyLength {
            return;
        }
        let record = match Arc::try_unwrap(handle) {
            Ok(record) => record.into_inner().unwrap_or_else(|e| e.into_inner()),
            // A batch that just answered the sequence's last round may still hold its
            // handle: the cache is taken out of the record, which the batch only drops.
            Err(handle) => {
                let Ok(mut record) = handle.try_lock() else {
                    return;
                };
                let Ok(empty) = self.target.new_cache() else {
                    return;
                };
                Sequence {
                    cache: std::mem::replace(&mut record.cache, empty),
                    tokens: std::mem::take(&mut record.tokens),
                    prefilled: record.prefilled,
                    scope: record.scope.clone(),
                    sampling: record.sampling,
                    rules: std::mem::take(&mut record.rules),
                    top_logprobs: record.top_logprobs,
                    prompt_len: record.prompt_len,
                    wants_carry: record.wants_carry,
                    rounds: RoundLog::new(0),
                    last_used: record.last_used,
                }
            }
        };
        let len = self.target.cache_len(&record.cache);
        if len == 0 || record.tokens.len() < len {
            return;
        }
        let mut tokens = record.tokens;
        tokens.truncate(len);
        let bytes = self.target.cache_bytes(&record.cache);
        self.prefixes.insert(
            record.scope,
            tokens,
            record.prefilled.min(len),
            record.cache,
            bytes,
            self.room_in_budget(),
        );
    }

    /// Bytes the prefix cache may grow by within the K/V budget (unbounded without one).
    fn room_in_budget(&self) -> usize {
        match self.admissions.budget().max_bytes {
            Some(limit) => {
                let (_, reserved) = self.admissions.reserved();
                let (held, _) = self.prefixes.held();
                limit.saturating_sub(reserved).saturating_sub(held)
            }
            None => usize::MAX,
        }
    }

    /// Evicts cached prefixes so that `tokens` positions and `bytes` more fit the K/V
    /// budget beside what sequences reserved: cached prefixes never refuse a sequence.
    pub(crate) fn make_room(&self, tokens: usize, bytes: usize) {
        let budget = self.admissions.budget();
        let (reserved_tokens, reserved_bytes) = self.admissions.reserved();
        let (held_bytes, held_tokens) = self.prefixes.held();
        if let Some(limit) = budget.max_bytes {
            let over = (reserved_bytes + bytes + held_bytes).saturating_sub(limit);
            if over > 0 {
                self.prefixes.free_bytes(over);
            }
        }
        if let Some(limit) = budget.max_tokens {
            let over = (reserved_tokens + tokens + held_tokens).saturating_sub(limit);
            if over > 0 {
                self.prefixes.free_tokens(over);
            }
        }
    }
}
