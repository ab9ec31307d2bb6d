//! An in-process verifier: sequences live in this process and rounds run on the caller's
//! thread, with no serialization. The embedded mode and the verifier server both use it.
//!
//! This file holds the sequences and their lifecycle (lookup, truncate, release); admission
//! and prefill are in `prefill.rs`, the verify phases in `verify.rs`, and core's `Verifier`
//! interface in `interface.rs`.

mod interface;
mod prefill;
mod verify;

use std::sync::{Arc, Mutex};

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use std::time::Instant;

use specd_core::{
    ForwardCost, PrefillRequest, Prefilled, SamplingParams, SeqId, Verified, Verifier,
    VerifyRequest,
};

use candle_core::Tensor;
use specd_models::gemma4::SharedKv;

use crate::admission::{Admissions, KvBudget, Reservation};
use crate::carry::TargetCarry;
use crate::error::VerifierError;
use crate::target::{TargetModel, MAX_ROLLBACK};
use crate::verify_block::{accept_and_rollback, block_tokens, token_from_hidden, HeadRows};
use specd_core::sync::lock;

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

pub(crate) struct Sequence<C> {
    pub cache: C,
    pub sampling: SamplingParams,
    /// The last round answered, kept so a retried round returns the same answer.
    pub last_round: Option<LastRound>,
}

/// A round's number, its block and its answer.
pub(crate) type LastRound = (u32, Vec<u32>, Verified<TargetCarry>);

/// One sequence's state, locked by whoever runs a step of it.
pub(crate) type SequenceHandle<C> = Arc<Mutex<Sequence<C>>>;

type SequenceTable<C> = DashMap<SeqId, SequenceHandle<C>>;

/// What a verify round needs next, once its request passed the checks.
pub(crate) enum VerifyStart {
    /// A retry of the last answered round: its stored answer.
    Replay(Verified<TargetCarry>),
    /// The block must be forwarded; the cache held `start_len` tokens before it.
    Run { start_len: usize },
}

pub struct LocalVerifier<T: TargetModel> {
    target: Arc<T>,
    sequences: SequenceTable<T::Cache>,
    limits: VerifierLimits,
    admissions: Admissions,
}

impl<T: TargetModel> LocalVerifier<T> {
    pub fn new(target: Arc<T>, limits: VerifierLimits) -> Self {
        Self {
            target,
            sequences: DashMap::new(),
            limits,
            admissions: Admissions::new(limits.max_sequences, KvBudget::default()),
        }
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
        let len = self.target.cache_len(&entry.cache);
        if committed_len > len {
            return Err(VerifierError::out_of_range(
                "committed_len",
                format!("{committed_len} exceeds the {len} tokens of the sequence"),
            ));
        }
        entry.last_round = None;
        self.target.truncate(&mut entry.cache, committed_len)
    }

    /// Frees a sequence and its K/V reservation; false when it was not live or admitted.
    pub fn release_sync(&self, seq: SeqId) -> bool {
        let live = self.sequences.remove(&seq).is_some();
        let admitted = self.admissions.release(seq);
        live || admitted
    }

    /// The sequence's committed length and the shared K/V a drafter mirrors, over every
    /// position still held (views of the cache, no copy). `None` when the target exports
    /// no shared K/V.
    pub fn shared_kv_sync(&self, seq: SeqId) -> Result<(usize, Option<SharedKv>), VerifierError> {
        let entry = self.sequence(seq)?;
        let entry = lock(&entry);
        let len = self.target.cache_len(&entry.cache);
        Ok((len, self.target.shared_kv(&entry.cache, 0, len)?))
    }

    /// The capacity limits this verifier enforces.
    pub fn limits(&self) -> VerifierLimits {
        self.limits
    }
}
