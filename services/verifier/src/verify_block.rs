//! One verify round on one sequence: the target's token at every position of the block, the
//! acceptance walk over them, and the cache rolled back to the accepted prefix.
//!
//! The LM head streams the largest matrix of the model, so it runs once per forward for
//! every row of every sequence in it, never once per checked slot: greedy rows take the
//! argmax epilogue (no logits materialised), sampled rows materialise their logits together
//! and draw with the keyed sampler.

use candle_core::{DType, Tensor};
use specd_core::sampling::{token_logprob, PenaltyContext};
use specd_core::{
    accept_tree, sample, Accepted, LogitRules, SamplingParams, TokenLogprob, TokenMask,
};

use crate::carry::TargetCarry;
use crate::error::VerifierError;
use crate::target::TargetModel;

/// The hidden states of one sequence's block and how its tokens are chosen.
pub struct HeadRows<'a> {
    /// Final-normed hidden states `[n, hidden]`.
    pub hidden: &'a Tensor,
    pub sampling: &'a SamplingParams,
    /// Output index of row 0's token (row `j` draws at `output_index_base + j`, or plus
    /// its depth in a token tree).
    pub output_index_base: u64,
    /// Each row's depth when the block is a token tree; empty for a chain (row `j` at
    /// depth `j`).
    pub depths: &'a [usize],
    pub shaping: RowShaping<'a>,
}

/// What a request adds to its rows' logits and wants reported, with the context the
/// penalties read.
#[derive(Clone, Copy)]
pub struct RowShaping<'a> {
    pub rules: &'a LogitRules,
    /// The sequence's prompt.
    pub prompt: &'a [u32],
    /// Output tokens in the cache before the block.
    pub output: &'a [u32],
    /// The tokens the rows consumed: row `j`'s context also holds `inputs[..=j]` (the bonus
    /// and the drafts up to its own; empty for a prefill's row).
    pub inputs: &'a [u32],
    /// One mask per row, or none.
    pub masks: &'a [TokenMask],
    pub top_logprobs: Option<u32>,
}

impl RowShaping<'_> {
    /// Nothing to add, nothing to report: rows may take the argmax epilogue when greedy.
    pub fn is_plain(&self) -> bool {
        self.rules.is_neutral() && self.masks.is_empty() && self.top_logprobs.is_none()
    }
}

static NO_RULES: LogitRules = LogitRules {
    presence_penalty: 0.0,
    frequency_penalty: 0.0,
    repetition_penalty: 0.0,
    logit_bias: Vec::new(),
    min_p: 0.0,
};

impl Default for RowShaping<'_> {
    fn default() -> Self {
        Self {
            rules: &NO_RULES,
            prompt: &[],
            output: &[],
            inputs: &[],
            masks: &[],
            top_logprobs: None,
        }
    }
}

/// The target's choice at every row of one block, and the log probabilities when asked.
#[derive(Clone, Debug, Default)]
pub struct RowChoices {
    pub tokens: Vec<u32>,
    /// Empty unless the block's sequence reports log probabilities.
    pub logprobs: Vec<TokenLogprob>,
}

/// The target's token at every row of every block, in one LM head pass per kind of row (one
/// for greedy blocks that add nothing, one for those whose logits must be read).
pub fn head_tokens<T: TargetModel>(
    target: &T,
    blocks: &[HeadRows<'_>],
) -> Result<Vec<RowChoices>, VerifierError> {
    let mut choices: Vec<RowChoices> = vec![RowChoices::default(); blocks.len()];
    let (greedy, shaped): (Vec<usize>, Vec<usize>) = (0..blocks.len())
        .partition(|&i| blocks[i].sampling.is_greedy() && blocks[i].shaping.is_plain());
    if !greedy.is_empty() {
        let flat = target.argmax(&stacked(blocks, &greedy)?)?;
        let mut rest = flat.as_slice();
        for &i in &greedy {
            let (mine, after) = rest.split_at(rows_of(&blocks[i])?.min(rest.len()));
            choices[i].tokens = mine.to_vec();
            rest = after;
        }
    }
    if !shaped.is_empty() {
        let logits = target
            .logits(&stacked(blocks, &shaped)?)?
            .to_dtype(DType::F32)?
            .to_vec2::<f32>()?;
        let mut rows = logits.into_iter();
        for &i in &shaped {
            choices[i] = choose_rows(&blocks[i], &mut rows)?;
        }
    }
    for (block, choice) in blocks.iter().zip(&choices) {
        if choice.tokens.len() != rows_of(block)? {
            return Err(VerifierError::Forward(format!(
                "the LM head gave {} tokens for {} rows",
                choice.tokens.len(),
                rows_of(block)?
            )));
        }
    }
    Ok(choices)
}

/// One block's rows from their logits: bias and penalties from the context up to each row,
/// the row's mask, its log probability, min-p, then the keyed sampler (argmax when greedy),
/// exactly as a plain step at that position would.
fn choose_rows(
    block: &HeadRows<'_>,
    rows: &mut impl Iterator<Item = Vec<f32>>,
) -> Result<RowChoices, VerifierError> {
    let shaping = &block.shaping;
    let count = rows_of(block)?;
    if !shaping.masks.is_empty() && shaping.masks.len() != count {
        return Err(VerifierError::invalid(
            "masks",
            format!("{} masks for {count} rows", shaping.masks.len()),
        ));
    }
    let mut context: PenaltyContext = shaping.rules.context(shaping.prompt, shaping.output);
    let mut choices = RowChoices::default();
    for slot in 0..count {
        let mut row = rows
            .next()
            .ok_or_else(|| VerifierError::Forward("the LM head lost rows".into()))?;
        if let Some(&input) = shaping.inputs.get(slot) {
            context.push(input);
        }
        shaping.rules.shape(&mut row, &context);
        if let Some(mask) = shaping.masks.get(slot) {
            mask.apply(&mut row)
                .map_err(|e| VerifierError::invalid("masks", format!("row {slot}: {e}")))?;
        }
        let reported = shaping.top_logprobs.map(|top| (top, row.clone()));
        shaping
            .rules
            .cut_min_p(&mut row, block.sampling.temperature);
        let depth = block.depths.get(slot).copied().unwrap_or(slot);
        let index = block.output_index_base + depth as u64;
        let token = sample(&row, block.sampling, index)
            .map_err(|e| VerifierError::invalid("sampling", e.to_string()))?;
        if let Some((top, shaped)) = reported {
            choices.logprobs.push(token_logprob(&shaped, token, top));
        }
        choices.tokens.push(token);
    }
    Ok(choices)
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
) -> Result<RowChoices, VerifierError> {
    head_tokens(target, &[block])?
        .pop()
        .ok_or_else(|| VerifierError::Forward("the LM head returned no row".into()))
}

/// The target's token after one position (`hidden`: `[1, hidden]`), at `output_index`, with
/// its log probability when asked.
pub fn token_from_hidden<T: TargetModel>(
    target: &T,
    hidden: &Tensor,
    sampling: &SamplingParams,
    output_index: u64,
    shaping: RowShaping<'_>,
) -> Result<(u32, Option<TokenLogprob>), VerifierError> {
    let block = HeadRows {
        hidden,
        sampling,
        output_index_base: output_index,
        depths: &[],
        shaping,
    };
    let mut choices = block_tokens(target, block)?;
    let token = choices
        .tokens
        .first()
        .copied()
        .ok_or_else(|| VerifierError::Forward("the LM head returned no token".into()))?;
    Ok((token, choices.logprobs.pop()))
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
    parents: &[u32],
    hidden: &Tensor,
    targets: &[u32],
    start_len: usize,
    budget: usize,
    want_kv: bool,
) -> Result<BlockOutcome, VerifierError> {
    let drafts = &tokens[1..];
    let (accepted, path) = accept_tree(drafts, parents, budget, |slot, _| {
        targets.get(slot).copied().ok_or_else(|| {
            VerifierError::Forward(format!(
                "target tokens: slot {slot} needed but only {} given",
                targets.len()
            ))
        })
    })?;
    let committed = accepted.accepted + 1;
    let end = start_len + committed;
    if parents.is_empty() {
        target.truncate(cache, end)?;
    } else {
        target.keep_path(cache, start_len, &path)?;
    }
    let last = path[path.len() - 1];
    let shared_kv = if want_kv {
        target.shared_kv(cache, start_len, end)?
    } else {
        None
    };
    let carry = TargetCarry {
        hidden: hidden.narrow(0, last, 1)?,
        shared_kv,
        committed: path.iter().map(|&slot| tokens[slot]).collect(),
        committed_len: end,
    };
    Ok(BlockOutcome { accepted, carry })
}
