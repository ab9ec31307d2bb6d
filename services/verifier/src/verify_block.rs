//! One verify round on one sequence: forward the block, walk the acceptance lazily (the LM
//! head runs only up to the first rejection), roll the cache back to the accepted prefix.

use candle_core::{DType, Tensor};
use specd_core::{accept_drafts, sample, Accepted, SamplingParams};

use crate::carry::TargetCarry;
use crate::error::VerifierError;
use crate::target::TargetModel;

/// Samples the target's token from the hidden state of one position.
pub fn sample_from_hidden<T: TargetModel>(
    target: &T,
    hidden_row: &Tensor,
    sampling: &SamplingParams,
    output_index: u64,
) -> Result<u32, VerifierError> {
    let logits = target
        .logits(hidden_row)?
        .squeeze(0)?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?;
    sample(&logits, sampling, output_index)
        .map_err(|e| VerifierError::invalid("sampling", e.to_string()))
}

/// The outcome of a verify round for one sequence.
pub struct BlockOutcome {
    pub accepted: Accepted,
    pub carry: TargetCarry,
}

/// Walks the acceptance over a forwarded block and rolls the cache back.
/// `hidden` is every position's hidden `[tokens, h]`; `start_len` the cache length before.
#[allow(clippy::too_many_arguments)]
pub fn accept_and_rollback<T: TargetModel>(
    target: &T,
    cache: &mut T::Cache,
    tokens: &[u32],
    hidden: &Tensor,
    start_len: usize,
    sampling: &SamplingParams,
    budget: usize,
    output_index_base: u64,
    want_kv: bool,
) -> Result<BlockOutcome, VerifierError> {
    let drafts = &tokens[1..];
    let accepted = accept_drafts(drafts, budget, |slot| {
        sample_from_hidden(
            target,
            &hidden.narrow(0, slot, 1)?,
            sampling,
            output_index_base + slot as u64,
        )
    })?;
    let committed = accepted.accepted + 1;
    let end = start_len + committed;
    target.truncate(cache, end)?;
    let shared_kv = if want_kv {
        target.shared_kv(cache, start_len, end)?
    } else {
        None
    };
    let carry = TargetCarry {
        hidden: hidden.narrow(0, accepted.accepted, 1)?,
        shared_kv,
        committed: tokens[..committed].to_vec(),
        committed_len: end,
    };
    Ok(BlockOutcome { accepted, carry })
}
