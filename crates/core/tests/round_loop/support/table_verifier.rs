//! A verifier over the table target: a token list as "KV cache", the crate's sampler and
//! acceptance walk, and faults on demand.

use specd_core::sync::lock;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, MutexGuard};

use specd_core::sampling::SamplingError;
use specd_core::{
    accept_drafts, sample, PrefillRequest, Prefilled, SamplingParams, SeqId, Verified, Verifier,
    VerifyRequest,
};

use super::table_target::Target;

/// Carry of the table sides: the tokens that entered the cache in that step (the prompt for
/// prefill), as a draft-model drafter would need.
pub type Carry = Vec<u32>;

/// Faults to inject, by round.
#[derive(Clone, Copy, Debug, Default)]
pub struct VerifierFaults {
    pub fail_at_round: Option<u32>,
    pub hang_at_round: Option<u32>,
    pub extra_token_at_round: Option<u32>,
    pub no_carry_at_round: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
#[error("table verifier: {0}")]
pub struct TableVerifierError(pub String);

impl From<SamplingError> for TableVerifierError {
    fn from(e: SamplingError) -> Self {
        Self(e.to_string())
    }
}

pub struct Sequence {
    pub cache: Vec<u32>,
    pub sampling: SamplingParams,
}

/// Everything the verifier saw.
#[derive(Default)]
pub struct VerifierLog {
    pub sequences: HashMap<SeqId, Sequence>,
    pub prefills: Vec<PrefillRequest>,
    pub verifies: Vec<VerifyRequest>,
    pub truncates: Vec<(SeqId, usize)>,
    pub released: Vec<SeqId>,
    pub released_detached: Vec<SeqId>,
}

#[derive(Default)]
pub struct TableVerifier {
    pub faults: VerifierFaults,
    pub target: Target,
    /// Prompt tokens a prefill says its prefix cache held (at most the whole prompt).
    cached_prompt: usize,
    log: Mutex<VerifierLog>,
}

impl TableVerifier {
    /// A verifier whose prefills say its prefix cache held `cached` prompt tokens.
    pub fn with_cached_prompt(cached: usize) -> Self {
        Self {
            cached_prompt: cached,
            ..Self::default()
        }
    }

    pub fn with_faults(faults: VerifierFaults) -> Self {
        Self {
            faults,
            ..Self::default()
        }
    }

    pub fn with_target(target: Target) -> Self {
        Self {
            target,
            ..Self::default()
        }
    }

    pub fn log(&self) -> MutexGuard<'_, VerifierLog> {
        lock(&self.log)
    }

    /// The width (bonus plus drafts) of every verify so far, in order.
    pub fn widths(&self) -> Vec<usize> {
        self.log().verifies.iter().map(|v| v.tokens.len()).collect()
    }

    fn prefill_now(&self, request: PrefillRequest) -> Result<Prefilled<Carry>, TableVerifierError> {
        let mut log = self.log();
        log.prefills.push(request.clone());
        let first_token = match &request.mask {
            None => self.target.token(&request.prompt_ids, &request.sampling, 0),
            Some(mask) => {
                let mut logits = self.target.logits(&request.prompt_ids);
                mask.apply(&mut logits)
                    .map_err(|e| TableVerifierError(e.to_string()))?;
                sample(&logits, &request.sampling, 0)?
            }
        };
        log.sequences.insert(
            request.seq,
            Sequence {
                cache: request.prompt_ids.clone(),
                sampling: request.sampling,
            },
        );
        Ok(Prefilled {
            first_token,
            cached_tokens: self.cached_prompt.min(request.prompt_ids.len()),
            carry: request.want_carry.then_some(request.prompt_ids),
            first_logprob: None,
        })
    }

    fn verify_now(&self, request: VerifyRequest) -> Result<Verified<Carry>, TableVerifierError> {
        let mut log = self.log();
        log.verifies.push(request.clone());
        let round = Some(request.round);
        if self.faults.fail_at_round == round {
            return Err(TableVerifierError(format!(
                "injected failure in round {round:?}"
            )));
        }
        let sequence = log
            .sequences
            .get_mut(&request.seq)
            .ok_or_else(|| TableVerifierError(format!("unknown {}", request.seq)))?;
        let base = sequence.cache.len();
        sequence.cache.extend_from_slice(&request.tokens);
        let cache = &sequence.cache;
        let sampling = sequence.sampling;
        let walk = accept_drafts(request.drafts(), request.budget, |slot| {
            let mut logits = self.target.logits(&cache[..base + slot + 1]);
            if let Some(mask) = request.masks.get(slot) {
                mask.apply(&mut logits)
                    .map_err(|e| TableVerifierError(e.to_string()))?;
            }
            sample(&logits, &sampling, request.output_index_base + slot as u64)
                .map_err(|e| TableVerifierError(e.to_string()))
        })?;
        sequence.cache.truncate(base + walk.accepted + 1);
        let committed = sequence.cache[base..].to_vec();
        let mut new_tokens = walk.new_tokens;
        if self.faults.extra_token_at_round == round {
            new_tokens.push(0);
        }
        let carry = request.want_carry && self.faults.no_carry_at_round != round;
        Ok(Verified {
            accepted: walk.accepted,
            new_tokens,
            carry: carry.then_some(committed),
            forward: None,
            logprobs: Vec::new(),
        })
    }
}

impl Verifier for TableVerifier {
    type Carry = Carry;
    type Error = TableVerifierError;

    fn prefill(
        &self,
        request: PrefillRequest,
    ) -> impl Future<Output = Result<Prefilled<Carry>, TableVerifierError>> + Send {
        std::future::ready(self.prefill_now(request))
    }

    fn verify(
        &self,
        request: VerifyRequest,
    ) -> impl Future<Output = Result<Verified<Carry>, TableVerifierError>> + Send {
        let hang = self.faults.hang_at_round == Some(request.round);
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
            self.verify_now(request)
        }
    }

    async fn truncate(&self, seq: SeqId, committed_len: usize) -> Result<(), TableVerifierError> {
        let mut log = self.log();
        log.truncates.push((seq, committed_len));
        if let Some(sequence) = log.sequences.get_mut(&seq) {
            sequence.cache.truncate(committed_len);
        }
        Ok(())
    }

    async fn release(&self, seq: SeqId) -> Result<(), TableVerifierError> {
        let mut log = self.log();
        log.released.push(seq);
        log.sequences.remove(&seq);
        Ok(())
    }

    fn release_detached(&self, seq: SeqId) {
        let mut log = self.log();
        log.released_detached.push(seq);
        log.sequences.remove(&seq);
    }
}
