//! An in-process verifier: sequences live in this process and rounds run on the caller's
//! thread, with no serialization. The embedded mode and the verifier server both use it.
//!
//! This file holds the table of sequences and their lifecycle (lookup, truncate, release,
//! expiry); the record itself is in `sequence.rs`, admission and prefill in `prefill.rs`, the
//! verify phases in `verify.rs`, and core's `Verifier` interface in `interface.rs`.

mod interface;
mod prefill;
mod prefix;
mod sequence;
mod verify;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use std::time::Instant;

use specd_core::{
    ForwardCost, PrefillRequest, Prefilled, PrefixCache, SeqId, Verified, Verifier, VerifyRequest,
};

use candle_core::Tensor;
use specd_models::gemma4::SharedKv;
use specd_models::SeqBlock;

use crate::admission::{Admissions, KvBudget, Reservation};
use crate::carry::TargetCarry;
use crate::error::VerifierError;
use crate::target::{TargetModel, MAX_ROLLBACK};
use crate::verify_block::{
    accept_and_rollback, block_tokens, token_from_hidden, HeadRows, RowChoices, RowShaping,
};
use specd_core::sampling::MAX_TOP_LOGPROBS;
use specd_core::sync::lock;
use specd_core::TokenMask;

/// Capacity limits of a verifier.
#[derive(Debug, Clone, Copy)]
pub struct VerifierLimits {
    /// Live sequences at most.
    pub max_sequences: usize,
}

impl Default for VerifierLimits {
    fn default() -> Self {
        Self { max_sequences: 256 }
    }
}

pub(crate) use prefix::SeededCache;
pub use sequence::RoundAnswer;
pub(crate) use sequence::{RoundLog, Sequence, SequenceHandle};
pub(crate) use verify::tree_depths;

type SequenceTable<C> = DashMap<SeqId, SequenceHandle<C>>;

/// What a verify round needs next, once its request passed the checks.
pub(crate) enum VerifyStart {
    /// A retry of the last answered round: its stored answer.
    Replay(Box<RoundAnswer>),
    /// The block must be forwarded; the cache held `start_len` tokens before it.
    Run { start_len: usize },
}

pub struct LocalVerifier<T: TargetModel> {
    target: Arc<T>,
    sequences: SequenceTable<T::Cache>,
    limits: VerifierLimits,
    admissions: Admissions,
    prefixes: PrefixCache<T::Cache>,
}

impl<T: TargetModel> LocalVerifier<T> {
    pub fn new(target: Arc<T>, limits: VerifierLimits) -> Self {
        let rule = target.prefix_rule();
        Self {
            target,
            sequences: DashMap::new(),
            limits,
            admissions: Admissions::new(limits.max_sequences, KvBudget::default()),
            prefixes: PrefixCache::new(0, rule),
        }
    }

    /// Keeps up to `max_bytes` of finished sequences' K/V (and prompt prefixes) for new
    /// sequences to start from; 0 keeps none. Within the K/V budget: admission evicts
    /// cached prefixes before it refuses a sequence.
    pub fn with_prefix_cache(mut self, max_bytes: usize) -> Self {
        self.prefixes = PrefixCache::new(max_bytes, self.target.prefix_rule());
        self
    }

    /// The prefix cache (its bounds, contents and counters).
    pub fn prefix_cache(&self) -> &PrefixCache<T::Cache> {
        &self.prefixes
    }

    /// Admits sequences only while their worst-case K/V fits `budget`.
    pub fn with_kv_budget(mut self, budget: KvBudget) -> Self {
        self.admissions = Admissions::new(self.limits.max_sequences, budget);
        self
    }

    pub fn target(&self) -> &Arc<T> {
        &self.target
    }

    /// Live sequences.
    pub fn sequence_count(&self) -> usize {
        self.sequences.len()
    }

    /// Bytes of K/V held by every live sequence.
    pub fn kv_bytes(&self) -> usize {
        let seqs: Vec<_> = self
            .sequences
            .iter()
            .map(|entry| entry.value().clone())
            .collect();
        seqs.iter()
            .map(|s| self.target.cache_bytes(&lock(s).cache))
            .sum()
    }

    /// The K/V memory budget sequences are admitted against.
    pub fn kv_budget(&self) -> KvBudget {
        self.admissions.budget()
    }

    /// Bytes the K/V budget allows (the token budget converted with the target's bound when
    /// only tokens are limited); 0 when unlimited.
    pub fn kv_capacity_bytes(&self) -> usize {
        let budget = self.admissions.budget();
        match (budget.max_bytes, budget.max_tokens) {
            (Some(bytes), Some(tokens)) => bytes.min(self.target.kv_bytes_bound(tokens)),
            (Some(bytes), None) => bytes,
            (None, Some(tokens)) => self.target.kv_bytes_bound(tokens),
            (None, None) => 0,
        }
    }

    /// K/V tokens and bytes that admitted sequences have reserved.
    pub fn kv_reserved(&self) -> (usize, usize) {
        self.admissions.reserved()
    }

    pub(crate) fn sequence(&self, seq: SeqId) -> Result<SequenceHandle<T::Cache>, VerifierError> {
        self.sequences
            .get(&seq)
            .map(|entry| entry.value().clone())
            .ok_or(VerifierError::UnknownSequence(seq))
    }

    fn check_tokens(&self, field: &str, tokens: &[u32]) -> Result<(), VerifierError> {
        let vocab = self.target.vocab_size();
        match tokens.iter().position(|&t| t as usize >= vocab) {
            Some(i) => Err(VerifierError::invalid(
                &format!("{field}[{i}]"),
                format!(
                    "token id {} is not below the vocabulary size {vocab}",
                    tokens[i]
                ),
            )),
            None => Ok(()),
        }
    }

    pub fn truncate_sync(&self, seq: SeqId, committed_len: usize) -> Result<(), VerifierError> {
        let Ok(entry) = self.sequence(seq) else {
            return Ok(());
        };
        let mut entry = lock(&entry);
        self.truncate_record(&mut entry, committed_len)
    }

    /// Rolls a locked record back to `committed_len` tokens; its last round can no longer
    /// be replayed.
    pub(crate) fn truncate_record(
        &self,
        seq: &mut Sequence<T::Cache>,
        committed_len: usize,
    ) -> Result<(), VerifierError> {
        let len = self.target.cache_len(&seq.cache);
        if committed_len > len {
            return Err(VerifierError::out_of_range(
                "committed_len",
                format!("{committed_len} exceeds the {len} tokens of the sequence"),
            ));
        }
        seq.rounds.last = None;
        self.target.truncate(&mut seq.cache, committed_len)?;
        seq.tokens.truncate(committed_len);
        Ok(())
    }

    /// Frees a sequence and its K/V reservation; false when it was not live or admitted.
    /// Its K/V stays behind in the prefix cache where that is on and it fits.
    pub fn release_sync(&self, seq: SeqId) -> bool {
        let (released, record) = self.detach(seq);
        if let Some(handle) = record {
            self.leave_behind(handle);
        }
        released
    }

    /// Takes a sequence out of the table and returns its reservation: whether it was live or
    /// admitted, and its record for [`Self::leave_behind`].
    pub(crate) fn detach(&self, seq: SeqId) -> (bool, Option<SequenceHandle<T::Cache>>) {
        let record = self.sequences.remove(&seq).map(|(_, handle)| handle);
        let admitted = self.admissions.release(seq);
        (record.is_some() || admitted, record)
    }

    /// The sequence's committed length and the shared K/V a drafter mirrors, over every
    /// position still held (views of the cache, no copy). `None` when the target exports
    /// no shared K/V.
    pub fn shared_kv_sync(&self, seq: SeqId) -> Result<(usize, Option<SharedKv>), VerifierError> {
        let entry = self.sequence(seq)?;
        let entry = lock(&entry);
        self.shared_kv_of(&entry)
    }

    /// [`Self::shared_kv_sync`] of a locked record.
    pub(crate) fn shared_kv_of(
        &self,
        seq: &Sequence<T::Cache>,
    ) -> Result<(usize, Option<SharedKv>), VerifierError> {
        let len = self.target.cache_len(&seq.cache);
        Ok((len, self.target.shared_kv(&seq.cache, 0, len)?))
    }

    /// Tokens in a locked record's cache.
    pub(crate) fn len_of(&self, seq: &Sequence<T::Cache>) -> usize {
        self.target.cache_len(&seq.cache)
    }

    /// Sequences not used for `timeout` and not in use right now.
    pub(crate) fn idle(&self, timeout: Duration) -> Vec<SeqId> {
        let handles: Vec<(SeqId, SequenceHandle<T::Cache>)> = self
            .sequences
            .iter()
            .map(|entry| (*entry.key(), entry.value().clone()))
            .collect();
        handles
            .into_iter()
            .filter(|(_, handle)| match handle.try_lock() {
                Ok(seq) => seq.last_used.elapsed() >= timeout,
                Err(_) => false,
            })
            .map(|(seq, _)| seq)
            .collect()
    }

    /// The capacity limits this verifier enforces.
    pub fn limits(&self) -> VerifierLimits {
        self.limits
    }
}
