//! One interface for every causal LM family the crate runs (Gemma 4 from safetensors,
//! Qwen2 from GGUF): packed forwards of several sequences at their own positions, logits or
//! the greedy token of chosen rows, rollback, and the K/V export a drafter reads where the
//! family has one.

use candle_core::Tensor;

use crate::error::Result;
use crate::shared_kv::SharedKv;

/// Which positions of each row a forward returns hidden states for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputRows {
    /// Every position (verify blocks).
    All,
    /// Only the last position of each row (the end of a prefill).
    Last,
    /// Nothing: only fill the caches (intermediate prefill chunks).
    None,
}

/// A block of new tokens for one sequence, run after what its cache holds.
pub struct SeqBlock<'a, C> {
    pub cache: &'a mut C,
    pub tokens: &'a [u32],
    /// The tree whose last nodes the tokens are (see [`crate::tree`]): its
    /// `parents.len() + 1` nodes end where the tokens do, the earlier ones already in the
    /// cache from earlier forwards of the tree. Empty: a chain, each token after the one
    /// before it.
    pub parents: &'a [u32],
}

impl<'a, C> SeqBlock<'a, C> {
    /// A chain of tokens after what `cache` holds.
    pub fn chain(cache: &'a mut C, tokens: &'a [u32]) -> Self {
        Self {
            cache,
            tokens,
            parents: &[],
        }
    }
}

/// Which prefix of one of a family's caches a new sequence may start from, so that it
/// computes, bit for bit, what a cold prefill of its prompt would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixReuse {
    /// Caches cannot seed other sequences.
    Never,
    /// Every position is computed the same whatever the rows beside it (any prefill
    /// chunking, verify block or decoding step), so any prefix is reusable.
    AnyLength,
    /// Only positions computed by the same whole prefill chunks of a prompt are the same.
    PrefillChunks,
}

impl PrefixReuse {
    /// The prefix cache's rule for a model of this reuse whose prompts are prefilled in
    /// pieces of `prefill_chunk` rows.
    pub fn rule(self, prefill_chunk: usize) -> specd_core::PrefixRule {
        match self {
            Self::Never => specd_core::PrefixRule::Never,
            Self::AnyLength => specd_core::PrefixRule::AnyLength,
            Self::PrefillChunks => specd_core::PrefixRule::PrefillChunks(prefill_chunk),
        }
    }
}

/// A hidden state's greedy token and its runner-up (none when only one id is allowed),
/// each with its logit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopTwo {
    pub best: (u32, f32),
    pub runner_up: Option<(u32, f32)>,
}

/// A causal LM with per-sequence caches that can be rolled back.
pub trait CausalLm: Send + Sync + 'static {
    type Cache: Send + 'static;

    fn vocab_size(&self) -> usize;
    fn max_context(&self) -> usize;
    /// Where the model runs (and its caches live).
    fn device(&self) -> &candle_core::Device;
    /// Rows a prompt is best prefilled in at most.
    fn default_prefill_chunk(&self) -> usize;

    /// An empty cache that can be rolled back at least `max_rollback` positions.
    fn new_cache(&self, max_rollback: usize) -> Result<Self::Cache>;
    fn cache_len(&self, cache: &Self::Cache) -> usize;
    /// Bytes the cache holds now.
    fn cache_bytes(&self, cache: &Self::Cache) -> usize;
    /// Most bytes a cache of `tokens` positions can take when prefilled in pieces of
    /// `chunk` rows and rolled back at most `max_rollback` positions (an upper bound, to
    /// admit sequences against a memory budget).
    fn kv_bytes_bound(&self, tokens: usize, chunk: usize, max_rollback: usize) -> usize;

    /// One packed forward over several sequences. Returns, per row, the final-normed hidden
    /// states `[positions, hidden]` of the positions `output` asks for (none for `None`).
    fn forward(
        &self,
        rows: &mut [SeqBlock<'_, Self::Cache>],
        output: OutputRows,
    ) -> Result<Vec<Tensor>>;
    /// Logits `[n, vocab]` of final-normed hidden states `[n, hidden]`.
    fn logits(&self, hidden: &Tensor) -> Result<Tensor>;
    /// The greedy token of each hidden state (the lowest id among equal logits).
    fn argmax(&self, hidden: &Tensor) -> Result<Vec<u32>> {
        self.argmax_below(hidden, self.vocab_size())
    }
    /// [`Self::argmax`] among the ids below `below` only (a drafter's restricted vocabulary);
    /// `below` is clamped to `1..=vocab`.
    fn argmax_below(&self, hidden: &Tensor, below: usize) -> Result<Vec<u32>> {
        each_logits_row(self, hidden, below, greedy_token)
    }
    /// [`Self::argmax_below`] (the same tokens) and each row's runner-up among the same
    /// ids, with their logits.
    fn top_two_below(&self, hidden: &Tensor, below: usize) -> Result<Vec<TopTwo>> {
        each_logits_row(self, hidden, below, top_two)
    }
    /// Keeps the first `len` positions of the cache.
    fn truncate(&self, cache: &mut Self::Cache, len: usize) -> Result<()>;
    /// Whether [`Self::forward`] takes blocks that form trees (non-empty `parents`), each
    /// node computed bit for bit as its path run token by token.
    fn supports_trees(&self) -> bool {
        false
    }
    /// Whether [`Self::forward`] computes every position's hidden state whatever
    /// [`OutputRows`] asks for (the rows asked for are only picked out), so a prefill piece
    /// costs the same in a forward that outputs every row: it may then run beside verify
    /// blocks in one pass over the weights.
    fn computes_every_row(&self) -> bool {
        false
    }
    /// After a tree block run at position `start`, keeps the nodes of `path` (root first,
    /// each the parent of the next) as positions `start..start + path.len()` and drops the
    /// rest, so the cache is as if the path alone had run.
    fn keep_path(&self, _cache: &mut Self::Cache, _start: usize, _path: &[usize]) -> Result<()> {
        Err(crate::error::ModelError::Unsupported(
            "token trees on this model".into(),
        ))
    }
    /// Makes `target` hold the first `len` positions of `source`, given that its first
    /// `shared` positions already equal `source`'s: a branch of a sequence at the cost of
    /// the positions it does not share. `Ok(false)` where the family's caches cannot be
    /// copied (nothing is changed then).
    fn copy_prefix(
        &self,
        _source: &Self::Cache,
        _target: &mut Self::Cache,
        _shared: usize,
        _len: usize,
    ) -> Result<bool> {
        Ok(false)
    }
    /// Which prefixes of this model's caches may seed new sequences.
    fn prefix_reuse(&self) -> PrefixReuse {
        PrefixReuse::Never
    }
    /// A new cache holding the first `len` positions of `source` exactly as a cold prefill
    /// of them leaves a cache (able to roll back `max_rollback` positions); `None` where the
    /// family cannot make one (positions no longer held, caches on a device).
    fn cache_prefix(
        &self,
        _source: &Self::Cache,
        _len: usize,
        _max_rollback: usize,
    ) -> Result<Option<Self::Cache>> {
        Ok(None)
    }
    /// K/V of positions `from..to` for a drafter, where the family exports it.
    fn shared_kv(
        &self,
        _cache: &Self::Cache,
        _from: usize,
        _to: usize,
    ) -> Result<Option<SharedKv>> {
        Ok(None)
    }
}

/// `pick` applied to each row's logits of the ids below `below` (clamped to `1..=vocab`), read
/// back to the host.
fn each_logits_row<M: CausalLm + ?Sized, T>(
    model: &M,
    hidden: &Tensor,
    below: usize,
    pick: fn(&[f32]) -> T,
) -> Result<Vec<T>> {
    let logits = model
        .logits(hidden)?
        .to_dtype(candle_core::DType::F32)?
        .to_vec2::<f32>()?;
    let below = below.clamp(1, model.vocab_size());
    Ok(logits
        .iter()
        .map(|row| pick(&row[..below.min(row.len())]))
        .collect())
}

/// [`greedy_token`] and the runner-up by the same order.
fn top_two(logits: &[f32]) -> TopTwo {
    top_two_with(greedy_token(logits), logits)
}

/// A row's greedy token `best` (found by whatever order the caller's argmax keeps) and the
/// largest other logit; NaN never wins.
pub fn top_two_with(best: u32, logits: &[f32]) -> TopTwo {
    let runner_up = logits
        .iter()
        .enumerate()
        .filter(|&(i, x)| i != best as usize && !x.is_nan())
        .fold(None, |b: Option<(usize, f32)>, (i, &x)| {
            if b.is_none_or(|(_, v)| x > v) {
                Some((i, x))
            } else {
                b
            }
        });
    TopTwo {
        best: (best, logits.get(best as usize).copied().unwrap_or(f32::NAN)),
        runner_up: runner_up.map(|(i, x)| (i as u32, x)),
    }
}

/// The lowest id among the largest logits; NaN never wins (an all-NaN row gives 0).
pub(crate) fn greedy_token(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in logits.iter().enumerate() {
        if x.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}
