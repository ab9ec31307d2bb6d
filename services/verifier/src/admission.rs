//! Admission of new sequences: a live-sequence limit and a K/V memory budget. Each admitted
//! sequence reserves its worst case up front, so a verifier under load refuses work at once
//! instead of running out of memory mid-generation.

use specd_core::sync::lock;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use specd_core::SeqId;

use crate::error::VerifierError;

/// The K/V memory a verifier may promise to its sequences; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvBudget {
    /// Cache positions, summed over every admitted sequence.
    pub max_tokens: Option<usize>,
    /// Bytes of keys and values, summed over every admitted sequence.
    pub max_bytes: Option<usize>,
}

/// What one sequence holds against the budget.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reservation {
    pub tokens: usize,
    pub bytes: usize,
}

#[derive(Default)]
struct Ledger {
    held: HashMap<SeqId, Reservation>,
    tokens: usize,
    bytes: usize,
}

/// Reservations of every admitted sequence, from admission until release.
pub(crate) struct Admissions {
    max_sequences: usize,
    budget: KvBudget,
    ledger: Mutex<Ledger>,
}

impl Admissions {
    pub fn new(max_sequences: usize, budget: KvBudget) -> Self {
        Self {
            max_sequences,
            budget,
            ledger: Mutex::default(),
        }
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // Totals are updated together with the map, so a poisoned ledger is still consistent.
        lock(&self.ledger)
    }

    pub fn budget(&self) -> KvBudget {
        self.budget
    }

    /// Reserves `wanted` for `seq`, or says which limit it does not fit.
    pub fn reserve(&self, seq: SeqId, wanted: Reservation) -> Result<(), VerifierError> {
        let mut ledger = self.ledger();
        if ledger.held.contains_key(&seq) {
            return Err(VerifierError::DuplicateSequence(seq));
        }
        if ledger.held.len() >= self.max_sequences {
            return Err(VerifierError::ResourceExhausted(format!(
                "{} sequences are live, the limit is {}",
                ledger.held.len(),
                self.max_sequences
            )));
        }
        if let Some(limit) = self.budget.max_tokens {
            if ledger.tokens + wanted.tokens > limit {
                return Err(VerifierError::ResourceExhausted(format!(
                    "max_kv_tokens: the sequence needs up to {} K/V tokens, {} of the limit \
                     of {limit} are reserved",
                    wanted.tokens, ledger.tokens
                )));
            }
        }
        if let Some(limit) = self.budget.max_bytes {
            if ledger.bytes + wanted.bytes > limit {
                return Err(VerifierError::ResourceExhausted(format!(
                    "max_kv_bytes: the sequence needs up to {} K/V bytes, {} of the limit \
                     of {limit} are reserved",
                    wanted.bytes, ledger.bytes
                )));
            }
        }
        ledger.tokens += wanted.tokens;
        ledger.bytes += wanted.bytes;
        ledger.held.insert(seq, wanted);
        Ok(())
    }

    /// Returns the reservation of `seq`; false when it held none.
    pub fn release(&self, seq: SeqId) -> bool {
        let mut ledger = self.ledger();
        match ledger.held.remove(&seq) {
            Some(r) => {
                ledger.tokens -= r.tokens;
                ledger.bytes -= r.bytes;
                true
            }
            None => false,
        }
    }

    pub fn holds(&self, seq: SeqId) -> bool {
        self.ledger().held.contains_key(&seq)
    }

    /// K/V tokens and bytes reserved right now.
    pub fn reserved(&self) -> (usize, usize) {
        let ledger = self.ledger();
        (ledger.tokens, ledger.bytes)
    }
}
