//! An in-process verifier: sequences live in this process and rounds run on the caller's
//! thread, with no serialization. The embedded mode and the verifier server both use it.

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

    /// Checks a prefill and reserves its worst case: the prompt, `max_new_tokens` (the whole
    /// context when unknown) and the rollback slack of one verify block. The reservation
    /// lasts until [`Self::release_sync`].
    pub(crate) fn admit(
        &self,
        request: &PrefillRequest,
        max_new_tokens: Option<usize>,
    ) -> Result<(), VerifierError> {
        if request.prompt_ids.is_empty() {
            return Err(VerifierError::invalid("prompt_ids", "must not be empty"));
        }
        self.check_tokens("prompt_ids", &request.prompt_ids)?;
        request
            .sampling
            .validate()
            .map_err(|e| VerifierError::invalid(e.field, e.reason))?;
        let limit = self.target.max_context();
        if request.prompt_ids.len() >= limit {
            return Err(VerifierError::out_of_range(
                "prompt_ids",
                format!(
                    "{} prompt tokens leave no room in the context limit of {limit}",
                    request.prompt_ids.len()
                ),
            ));
        }
        if self.sequences.contains_key(&request.seq) {
            return Err(VerifierError::DuplicateSequence(request.seq));
        }
        let tokens = match max_new_tokens {
            Some(new) => request
                .prompt_ids
                .len()
                .saturating_add(new)
                .saturating_add(MAX_ROLLBACK + 1)
                .min(limit),
            None => limit,
        };
        let wanted = Reservation {
            tokens,
            bytes: self.target.kv_bytes_bound(tokens),
        };
        self.admissions.reserve(request.seq, wanted)
    }

    /// Samples the first token of a prefilled cache and makes the sequence live. The
    /// sequence must have been admitted; one released meanwhile stays gone.
    pub(crate) fn finish_prefill(
        &self,
        request: PrefillRequest,
        cache: T::Cache,
        hidden: Tensor,
    ) -> Result<Prefilled<TargetCarry>, VerifierError> {
        let first_token = token_from_hidden(&*self.target, &hidden, &request.sampling, 0)?;
        let len = self.target.cache_len(&cache);
        let carry = if request.want_carry {
            Some(TargetCarry {
                hidden,
                shared_kv: self.target.shared_kv(&cache, 0, len).ok().flatten(),
                committed: request.prompt_ids.clone(),
                committed_len: len,
            })
        } else {
            None
        };
        let entry = Sequence {
            cache,
            sampling: request.sampling,
            last_round: None,
        };
        // The vacant entry keeps a release of this id waiting until the sequence is in, so a
        // release either finds it or ends the admission before this checks it.
        match self.sequences.entry(request.seq) {
            Entry::Occupied(_) => return Err(VerifierError::DuplicateSequence(request.seq)),
            Entry::Vacant(_) if !self.admissions.holds(request.seq) => {
                return Err(VerifierError::UnknownSequence(request.seq))
            }
            Entry::Vacant(slot) => {
                slot.insert(Arc::new(Mutex::new(entry)));
            }
        }
        Ok(Prefilled { first_token, carry })
    }

    pub fn prefill_sync(
        &self,
        request: PrefillRequest,
    ) -> Result<Prefilled<TargetCarry>, VerifierError> {
        self.prefill_sync_with_budget(request, None)
    }

    /// A prefill that reserves K/V for `max_new_tokens` generated tokens (the whole context
    /// when `None`).
    pub fn prefill_sync_with_budget(
        &self,
        request: PrefillRequest,
        max_new_tokens: Option<usize>,
    ) -> Result<Prefilled<TargetCarry>, VerifierError> {
        self.admit(&request, max_new_tokens)?;
        let seq = request.seq;
        let run = || {
            let mut cache = self.target.new_cache()?;
            let hidden = self.target.prefill(&mut cache, &request.prompt_ids)?;
            self.finish_prefill(request, cache, hidden)
        };
        let result = run();
        if result.is_err() {
            self.admissions.release(seq);
        }
        result
    }

    /// Replays a retried round or checks a new one before its forward.
    pub(crate) fn begin_verify(
        &self,
        seq: &Sequence<T::Cache>,
        request: &VerifyRequest,
    ) -> Result<VerifyStart, VerifierError> {
        if let Some((round, tokens, answer)) = &seq.last_round {
            if *round == request.round {
                if *tokens != request.tokens {
                    return Err(VerifierError::invalid(
                        "round",
                        "a retried round must send the same tokens",
                    ));
                }
                return Ok(VerifyStart::Replay(answer.clone()));
            }
        }
        let tokens = &request.tokens;
        if tokens.is_empty() {
            return Err(VerifierError::invalid(
                "tokens",
                "must hold at least the bonus token",
            ));
        }
        if tokens.len() > MAX_ROLLBACK + 1 {
            return Err(VerifierError::out_of_range(
                "tokens",
                format!(
                    "a block of {} tokens exceeds the maximum of {}",
                    tokens.len(),
                    MAX_ROLLBACK + 1
                ),
            ));
        }
        if request.budget == 0 {
            return Err(VerifierError::invalid("budget", "must be at least 1"));
        }
        self.check_tokens("tokens", tokens)?;
        let start_len = self.target.cache_len(&seq.cache);
        let limit = self.target.max_context();
        if start_len + tokens.len() > limit {
            return Err(VerifierError::out_of_range(
                "tokens",
                format!(
                    "the sequence would reach {} tokens, over the context limit of {limit}",
                    start_len + tokens.len()
                ),
            ));
        }
        Ok(VerifyStart::Run { start_len })
    }

    /// Accepts and rolls back a forwarded block (`hidden`: every position's hidden,
    /// `targets`: the target's token at each), and records the answer for retries. On error
    /// the cache is left as before the round.
    pub(crate) fn finish_verify(
        &self,
        seq: &mut Sequence<T::Cache>,
        request: &VerifyRequest,
        hidden: &Tensor,
        targets: &[u32],
        start_len: usize,
    ) -> Result<Verified<TargetCarry>, VerifierError> {
        let outcome = accept_and_rollback(
            &*self.target,
            &mut seq.cache,
            &request.tokens,
            hidden,
            targets,
            start_len,
            request.budget,
            request.want_carry,
        );
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                let _ = self.target.truncate(&mut seq.cache, start_len);
                return Err(e);
            }
        };
        let answer = Verified {
            accepted: outcome.accepted.accepted,
            new_tokens: outcome.accepted.new_tokens,
            carry: request.want_carry.then_some(outcome.carry),
            forward: None,
        };
        seq.last_round = Some((request.round, request.tokens.clone(), answer.clone()));
        Ok(answer)
    }

    /// The first position the sequence's sliding shared K/V still holds, when the target
    /// exports one.
    pub(crate) fn sliding_start(
        &self,
        seq: &Sequence<T::Cache>,
    ) -> Result<Option<usize>, VerifierError> {
        let len = self.target.cache_len(&seq.cache);
        Ok(self
            .target
            .shared_kv(&seq.cache, 0, len)?
            .and_then(|kv| kv.sliding.map(|s| s.start)))
    }

    pub fn verify_sync(
        &self,
        request: VerifyRequest,
    ) -> Result<Verified<TargetCarry>, VerifierError> {
        let seq = self.sequence(request.seq)?;
        let mut seq = lock(&seq);
        let start_len = match self.begin_verify(&seq, &request)? {
            VerifyStart::Replay(answer) => return Ok(answer),
            VerifyStart::Run { start_len } => start_len,
        };
        let started = Instant::now();
        let forwarded = {
            let mut rows = [(&mut seq.cache, request.tokens.as_slice())];
            self.target.forward_blocks(&mut rows)
        };
        let hidden = match forwarded.map(|mut rows| rows.pop()) {
            Ok(Some(hidden)) => hidden,
            Ok(None) => {
                let _ = self.target.truncate(&mut seq.cache, start_len);
                return Err(VerifierError::invalid("tokens", "empty forward"));
            }
            Err(e) => {
                let _ = self.target.truncate(&mut seq.cache, start_len);
                return Err(e);
            }
        };
        let targets = block_tokens(
            &*self.target,
            HeadRows {
                hidden: &hidden,
                sampling: &seq.sampling,
                output_index_base: request.output_index_base,
            },
        );
        let targets = match targets {
            Ok(targets) => targets,
            Err(e) => {
                let _ = self.target.truncate(&mut seq.cache, start_len);
                return Err(e);
            }
        };
        let mut answer = self.finish_verify(&mut seq, &request, &hidden, &targets, start_len)?;
        // Acceptance on the logits is part of what a verify of this width costs.
        answer.forward = Some(ForwardCost {
            tokens: request.tokens.len(),
            rows: 1,
            time: started.elapsed(),
        });
        Ok(answer)
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

impl<T: TargetModel> Verifier for LocalVerifier<T> {
    type Carry = TargetCarry;
    type Error = VerifierError;

    fn prefill(
        &self,
        request: PrefillRequest,
    ) -> impl std::future::Future<Output = Result<Prefilled<TargetCarry>, VerifierError>> + Send
    {
        std::future::ready(self.prefill_sync(request))
    }

    fn verify(
        &self,
        request: VerifyRequest,
    ) -> impl std::future::Future<Output = Result<Verified<TargetCarry>, VerifierError>> + Send
    {
        std::future::ready(self.verify_sync(request))
    }

    fn truncate(
        &self,
        seq: SeqId,
        committed_len: usize,
    ) -> impl std::future::Future<Output = Result<(), VerifierError>> + Send {
        std::future::ready(self.truncate_sync(seq, committed_len))
    }

    fn release(
        &self,
        seq: SeqId,
    ) -> impl std::future::Future<Output = Result<(), VerifierError>> + Send {
        let _ = self.release_sync(seq);
        std::future::ready(Ok(()))
    }

    fn release_detached(&self, seq: SeqId) {
        let _ = self.release_sync(seq);
    }
}
