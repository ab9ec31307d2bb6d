//! One verify round on one sequence: the target's token at every position of the block, the
//! acceptance walk over them, and the cache rolled back to the accepted prefix.
//!
//! The LM head streams the largest matrix of the model, so it runs once per forward for
//! every row of every sequence in it, never once per checked slot: greedy rows take the
//! argmax epilogue (no logits materialised), sampled rows materialise their logits together
//! and draw with the keyed sampler.

use candle_core::{DType, Tensor};
use specd_core::{accept_with_targets, sample, Accepted, SamplingParams};

use crate::carry::TargetCarry;
use crate::error::VerifierError;
use crate::target::TargetModel;

/// The hidden states of one sequence's block and how its tokens are chosen.
pub struct HeadRows<'a> {
    /// Final-normed hidden states `[n, hidden]`.
    pub hidden: &'a Tensor,
    pub sampling: &'a SamplingParams,
    /// Output index of row 0's token (row `j` draws at `output_index_base + j`).
    pub output_index_base: u64,
}

/// The target's token at every row of every block, in one LM head pass per sampling kind
/// (one for the greedy blocks, one for the sampled ones).
pub fn head_tokens<T: TargetModel>(
    target: &T,
    blocks: &[HeadRows<'_>],
) -> Result<Vec<Vec<u32>>, VerifierError> {
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); blocks.len()];
    let (greedy, sampled): (Vec<usize>, Vec<usize>) =
        (0..blocks.len()).partition(|&i| blocks[i].sampling.is_greedy());
    if !greedy.is_empty() {
        let flat = target.argmax(&stacked(blocks, &greedy)?)?;
        let mut rest = flat.as_slice();
        for &i in &greedy {
            let (mine, after) = rest.split_at(rows_of(&blocks[i])?.min(rest.len()));
            tokens[i] = mine.to_vec();
            rest = after;
        }
    }
    if !sampled.is_empty() {
        let logits = target
            .logits(&stacked(blocks, &sampled)?)?
            .to_dtype(DType::F32)?
            .to_vec2::<f32>()?;
        let mut rows = logits.iter();
        for &i in &sampled {
            let block = &blocks[i];
            for slot in 0..rows_of(block)? {
                let row = rows
                    .next()
                    .ok_or_else(|| VerifierError::Forward("the LM head lost rows".into()))?;
                let index = block.output_index_base + slot as u64;
                let token = sample(row, block.sampling, index)
                    .map_err(|e| VerifierError::invalid("sampling", e.to_string()))?;
                tokens[i].push(token);
            }
        }
    }
    for (block, tokens) in blocks.iter().zip(&tokens) {
        if tokens.len() != rows_of(block)? {
            return Err(VerifierError::Forward(format!(
                "the LM head gave {} tokens for {} rows",
                tokens.len(),
                rows_of(block)?
            )));
        }
    }
    Ok(tokens)
}

fn rows_of(block: &HeadRows<'_>) -> Result<usize, VerifierError> {
    Ok(block.hidden.dim(0)?)
}

/// The chosen blocks' hidden rows, one after another.
fn stacked(blocks: &[HeadRows<'_>], chosen: &[usize]) -> Result<Tensor, VerifierError> {
    if let [only] = chosen {
        return Ok(blocks[*only].hidden.clone());
    }
    let parts: Vec<&Tensor> = chosen.iter().map(|&i| blocks[i].hidden).collect();
    Ok(Tensor::cat(&parts, 0)?)
}

/// [`head_tokens`] of one sequence's block.
pub fn block_tokens<T: TargetModel>(
    target: &T,
    block: HeadRows<'_>,
) -> Result<Vec<u32>, VerifierError> {
    head_tokens(target, &[block])?
        .pop()
        .ok_or_else(|| VerifierError::Forward("the LM head returned no row".into()))
}

/// The target's token after one position (`hidden`: `[1, hidden]`), at `output_index`.
pub fn token_from_hidden<T: TargetModel>(
    target: &T,
    hidden: &Tensor,
    sampling: &SamplingParams,
    output_index: u64,
) -> Result<u32, VerifierError> {
    let block = HeadRows {
        hidden,
        sampling,
        output_index_base: output_index,
    };
    block_tokens(target, block)?
        .first()
        .copied()
        .ok_or_else(|| VerifierError::Forward("the LM head returned no token".into()))
}

/// The outcome of a verify round for one sequence.
pub struct BlockOutcome {
    pub accepted: Accepted,
    pub carry: TargetCarry,
}

/// Walks the acceptance over a forwarded block and rolls the cache back.
/// `hidden` is every position's hidden `[tokens, h]`, `targets` the target's token at each
/// of them; `start_len` the cache length before.
#[allow(clippy::too_many_arguments)]
pub fn accept_and_rollback<T: TargetModel>(
    target: &T,
    cache: &mut T::Cache,
    tokens: &[u32],
    hidden: &Tensor,
    targets: &[u32],
    start_len: usize,
    budget: usize,
    want_kv: bool,
) -> Result<BlockOutcome, VerifierError> {
    let drafts = &tokens[1..];
    let accepted = accept_with_targets(drafts, targets, budget)
        .map_err(|e| VerifierError::Forward(e.to_string()))?;
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
