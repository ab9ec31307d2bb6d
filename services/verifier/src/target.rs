//! The target models a verifier can run: any [`CausalLm`] of the models crate.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use specd_core::PrefixRule;
use specd_models::family::EosSource;
use specd_models::gemma4::{Gemma4Model, SharedKv};
use specd_models::qwen2::{LoadOptions, Qwen2Model};
use specd_models::{AnyLm, CausalLm, LoadSpec, ModelSource, OutputRows, SeqBlock};

use crate::error::VerifierError;

/// A causal LM with per-sequence caches that can be rolled back.
pub trait TargetModel: Send + Sync + 'static {
    type Cache: Send + 'static;

    fn vocab_size(&self) -> usize;
    fn max_context(&self) -> usize;
    fn eos_token_ids(&self) -> Vec<u32>;
    fn new_cache(&self) -> Result<Self::Cache, VerifierError>;
    fn cache_len(&self, cache: &Self::Cache) -> usize;
    fn cache_bytes(&self, cache: &Self::Cache) -> usize;
    /// Most bytes of K/V a cache holding `tokens` positions can take (an upper bound, used
    /// to admit sequences against a memory budget).
    fn kv_bytes_bound(&self, tokens: usize) -> usize;
    /// Rows of the prompt one prefill step runs at most.
    fn prefill_chunk_len(&self) -> usize;
    /// Runs one prefill piece (at most [`Self::prefill_chunk_len`] tokens). On the `last`
    /// piece, returns the hidden `[1, hidden]` of its last position.
    fn prefill_piece(
        &self,
        cache: &mut Self::Cache,
        piece: &[u32],
        last: bool,
    ) -> Result<Option<Tensor>, VerifierError>;
    /// Fills the cache with the prompt; returns the last position's hidden `[1, hidden]`.
    /// The same steps as a batch scheduler interleaves, so both give identical caches.
    fn prefill(&self, cache: &mut Self::Cache, tokens: &[u32]) -> Result<Tensor, VerifierError> {
        let pieces: Vec<&[u32]> = tokens.chunks(self.prefill_chunk_len().max(1)).collect();
        let mut hidden = None;
        for (i, piece) in pieces.iter().enumerate() {
            hidden = self.prefill_piece(cache, piece, i + 1 == pieces.len())?;
        }
        hidden.ok_or_else(|| VerifierError::invalid("prompt_ids", "must not be empty"))
    }
    /// Runs several sequences' blocks (chains or trees) in one forward; per row, every
    /// position's hidden.
    fn forward_blocks(
        &self,
        rows: &mut [SeqBlock<'_, Self::Cache>],
    ) -> Result<Vec<Tensor>, VerifierError>;
    /// Whether [`Self::forward_blocks`] takes token trees.
    fn supports_trees(&self) -> bool;
    /// Whether a prefill piece may run in a [`Self::forward_blocks`] call beside verify
    /// blocks at no extra cost to it (its rows' hidden states are computed either way), and
    /// leave the cache and last hidden state [`Self::prefill_piece`] would.
    fn prefill_joins_blocks(&self) -> bool {
        false
    }
    /// After a tree block run at `start`, keeps the nodes of `path` (root first) as the
    /// positions after `start` and drops the rest.
    fn keep_path(
        &self,
        cache: &mut Self::Cache,
        start: usize,
        path: &[usize],
    ) -> Result<(), VerifierError>;
    /// Logits `[n, vocab]` of hidden states `[n, hidden]`.
    fn logits(&self, hidden: &Tensor) -> Result<Tensor, VerifierError>;
    /// The greedy token of each hidden state `[n, hidden]` (the lowest id among equal
    /// logits), in one pass of the LM head; the CPU engine never materialises the logits.
    fn argmax(&self, hidden: &Tensor) -> Result<Vec<u32>, VerifierError>;
    fn truncate(&self, cache: &mut Self::Cache, len: usize) -> Result<(), VerifierError>;
    /// K/V rows of positions `from .. to` for a drafter, if this target exports them.
    fn shared_kv(
        &self,
        cache: &Self::Cache,
        from: usize,
        to: usize,
    ) -> Result<Option<SharedKv>, VerifierError>;
    /// Which prefixes of this target's caches a new sequence may start from.
    fn prefix_rule(&self) -> PrefixRule;
    /// A new cache holding the first `len` positions of `source` as a cold prefill of them
    /// leaves one; `None` where the target cannot make it.
    fn cache_prefix(
        &self,
        source: &Self::Cache,
        len: usize,
    ) -> Result<Option<Self::Cache>, VerifierError>;
}

/// Most tokens a verify block may roll back.
pub const MAX_ROLLBACK: usize = 16;

/// A causal LM as a verifier's target: the model, its end-of-sequence ids and the rows a
/// prompt is prefilled in.
pub struct LmTarget<M: CausalLm> {
    model: M,
    eos: Vec<u32>,
    prefill_chunk: usize,
}

/// The Gemma 4 target (safetensors directory).
pub type Gemma4Target = LmTarget<Gemma4Model>;

/// The Qwen2 target (GGUF file): the real Qwen2.5-Coder model of the demo and benchmarks.
pub type Qwen2Target = LmTarget<Qwen2Model>;

impl<M: CausalLm> LmTarget<M> {
    pub fn new(model: M, eos: Vec<u32>) -> Self {
        let prefill_chunk = model.default_prefill_chunk();
        Self {
            model,
            eos,
            prefill_chunk,
        }
    }

    /// Prefills in pieces of `chunk` rows (at least 1). Where a family's kernels depend on
    /// the row count (Gemma 4 on GEMM above the exact-kernel limit), a solo run and a
    /// batched server compare equal only with the same chunk.
    pub fn with_prefill_chunk(mut self, chunk: usize) -> Self {
        self.prefill_chunk = chunk.max(1);
        self
    }

    pub fn model(&self) -> &M {
        &self.model
    }
}

/// A target of any family of the registry ([`specd_models::family`]).
pub type AnyTarget = LmTarget<AnyLm>;

impl AnyTarget {
    /// Loads the checkpoint `source` as a target. `tokenizer_eos` are its text side's
    /// end-of-sequence ids (`None` where it has no tokenizer); a family that names them only
    /// in its tokenizer needs them.
    pub fn load(
        source: &ModelSource,
        spec: &LoadSpec<'_>,
        tokenizer_eos: Option<&[u32]>,
    ) -> Result<Self, VerifierError> {
        let family = source.lm_family()?;
        let eos = match (family.eos, tokenizer_eos) {
            (EosSource::Config, _) => None,
            (EosSource::Tokenizer, Some(ids)) => Some(ids.to_vec()),
            (EosSource::Tokenizer, None) => {
                return Err(VerifierError::invalid(
                    "target",
                    format!(
                        "{}: a {} target reads its end-of-sequence ids from its tokenizer, \
                         which did not load",
                        source.path().display(),
                        source.family().name
                    ),
                ))
            }
        };
        let loaded = source.load_lm(spec)?;
        Ok(Self::new(loaded.model, eos.unwrap_or(loaded.eos_token_ids)))
    }
}

impl Gemma4Target {
    pub fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Self, VerifierError> {
        let model = Gemma4Model::load(dir, dtype, device)?;
        let eos = model.config().eos_token_ids.clone();
        Ok(Self::new(model, eos))
    }
}

impl Qwen2Target {
    /// Loads a GGUF file; `eos` are the end-of-sequence ids (from its tokenizer).
    pub fn load(path: &Path, device: &Device, eos: Vec<u32>) -> Result<Self, VerifierError> {
        let model = Qwen2Model::load_with(path, device, &LoadOptions::default())
            .map_err(specd_models::ModelError::from)?;
        Ok(Self::new(model, eos))
    }
}

impl<M: CausalLm> TargetModel for LmTarget<M> {
    type Cache = M::Cache;

    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }

    fn max_context(&self) -> usize {
        self.model.max_context()
    }

    fn eos_token_ids(&self) -> Vec<u32> {
        self.eos.clone()
    }

    fn new_cache(&self) -> Result<M::Cache, VerifierError> {
        Ok(self.model.new_cache(MAX_ROLLBACK)?)
    }

    fn cache_len(&self, cache: &M::Cache) -> usize {
        self.model.cache_len(cache)
    }

    fn cache_bytes(&self, cache: &M::Cache) -> usize {
        self.model.cache_bytes(cache)
    }

    fn kv_bytes_bound(&self, tokens: usize) -> usize {
        self.model
            .kv_bytes_bound(tokens, self.prefill_chunk, MAX_ROLLBACK)
    }

    fn prefill_chunk_len(&self) -> usize {
        self.prefill_chunk
    }

    fn prefill_piece(
        &self,
        cache: &mut M::Cache,
        piece: &[u32],
        last: bool,
    ) -> Result<Option<Tensor>, VerifierError> {
        if piece.is_empty() {
            return Err(VerifierError::invalid("prompt_ids", "must not be empty"));
        }
        // No output rows until the final piece.
        let mode = if last {
            OutputRows::Last
        } else {
            OutputRows::None
        };
        let mut rows = [SeqBlock::chain(cache, piece)];
        let hidden = self.model.forward(&mut rows, mode)?.pop();
        if last {
            let hidden = hidden.ok_or_else(|| {
                VerifierError::invalid("prompt_ids", "the prefill returned no hidden state")
            })?;
            Ok(Some(hidden))
        } else {
            Ok(None)
        }
    }

    fn forward_blocks(
        &self,
        rows: &mut [SeqBlock<'_, M::Cache>],
    ) -> Result<Vec<Tensor>, VerifierError> {
        Ok(self.model.forward(rows, OutputRows::All)?)
    }

    fn supports_trees(&self) -> bool {
        self.model.supports_trees()
    }

    fn prefill_joins_blocks(&self) -> bool {
        self.model.computes_every_row()
    }

    fn keep_path(
        &self,
        cache: &mut M::Cache,
        start: usize,
        path: &[usize],
    ) -> Result<(), VerifierError> {
        Ok(self.model.keep_path(cache, start, path)?)
    }

    fn logits(&self, hidden: &Tensor) -> Result<Tensor, VerifierError> {
        Ok(self.model.logits(hidden)?)
    }

    fn argmax(&self, hidden: &Tensor) -> Result<Vec<u32>, VerifierError> {
        Ok(self.model.argmax(hidden)?)
    }

    fn truncate(&self, cache: &mut M::Cache, len: usize) -> Result<(), VerifierError> {
        Ok(self.model.truncate(cache, len)?)
    }

    fn shared_kv(
        &self,
        cache: &M::Cache,
        from: usize,
        to: usize,
    ) -> Result<Option<SharedKv>, VerifierError> {
        Ok(self.model.shared_kv(cache, from, to)?)
    }

    fn prefix_rule(&self) -> PrefixRule {
        self.model.prefix_reuse().rule(self.prefill_chunk)
    }

    fn cache_prefix(
        &self,
        source: &M::Cache,
        len: usize,
    ) -> Result<Option<M::Cache>, VerifierError> {
        Ok(self.model.cache_prefix(source, len, MAX_ROLLBACK)?)
    }
}
