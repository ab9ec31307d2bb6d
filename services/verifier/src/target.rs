//! The target models a verifier can run.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use specd_models::gemma4::{
    BlockInput, Gemma4Model, LayerKind, OutputRows, SequenceCache, SharedKv, DEFAULT_PREFILL_CHUNK,
};

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
    /// Runs several sequences' blocks in one forward; per row, every position's hidden.
    fn forward_blocks(
        &self,
        rows: &mut [(&mut Self::Cache, &[u32])],
    ) -> Result<Vec<Tensor>, VerifierError>;
    /// Logits `[n, vocab]` of hidden states `[n, hidden]`.
    fn logits(&self, hidden: &Tensor) -> Result<Tensor, VerifierError>;
    fn truncate(&self, cache: &mut Self::Cache, len: usize) -> Result<(), VerifierError>;
    /// K/V rows of positions `from .. to` for a drafter, if this target exports them.
    fn shared_kv(
        &self,
        cache: &Self::Cache,
        from: usize,
        to: usize,
    ) -> Result<Option<SharedKv>, VerifierError>;
}

/// Most tokens a verify block may roll back.
pub const MAX_ROLLBACK: usize = 16;

pub struct Gemma4Target {
    model: Gemma4Model,
    prefill_chunk: usize,
}

impl Gemma4Target {
    pub fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Self, VerifierError> {
        Ok(Self {
            model: Gemma4Model::load(dir, dtype, device)?,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
        })
    }

    /// Prefills in pieces of `chunk` rows (at least 1). Pieces above the exact-kernel row
    /// limit run on GEMM, so a solo run and a batched server compare equal only with the
    /// same chunk.
    pub fn with_prefill_chunk(mut self, chunk: usize) -> Self {
        self.prefill_chunk = chunk.max(1);
        self
    }

    pub fn model(&self) -> &Gemma4Model {
        &self.model
    }
}

impl TargetModel for Gemma4Target {
    type Cache = SequenceCache;

    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn max_context(&self) -> usize {
        self.model.config().max_position_embeddings
    }

    fn eos_token_ids(&self) -> Vec<u32> {
        self.model.config().eos_token_ids.clone()
    }

    fn new_cache(&self) -> Result<SequenceCache, VerifierError> {
        Ok(self.model.new_cache(MAX_ROLLBACK))
    }

    fn cache_len(&self, cache: &SequenceCache) -> usize {
        cache.len()
    }

    fn cache_bytes(&self, cache: &SequenceCache) -> usize {
        cache.kv_bytes()
    }

    fn kv_bytes_bound(&self, tokens: usize) -> usize {
        let cfg = self.model.config();
        let elem = self.model.dtype().size_in_bytes();
        // A sliding layer keeps the window plus the rollback slack, and briefly one more
        // forward's rows before trimming.
        let sliding_rows = cfg.sliding_window + MAX_ROLLBACK + self.prefill_chunk;
        cfg.layers
            .iter()
            .enumerate()
            .filter(|(i, layer)| layer.kv_source == *i)
            .map(|(_, layer)| {
                let rows = match layer.kind {
                    LayerKind::Sliding => tokens.min(sliding_rows),
                    LayerKind::Full => tokens,
                };
                2 * layer.num_kv_heads * layer.head_dim * rows * elem
            })
            .sum()
    }

    fn prefill_chunk_len(&self) -> usize {
        self.prefill_chunk
    }

    fn prefill_piece(
        &self,
        cache: &mut SequenceCache,
        piece: &[u32],
        last: bool,
    ) -> Result<Option<Tensor>, VerifierError> {
        // The very steps of `Gemma4Model::prefill`: no output rows until the final piece.
        let mode = if last {
            OutputRows::Last
        } else {
            OutputRows::None
        };
        let mut rows = [BlockInput {
            cache,
            tokens: piece,
        }];
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
        rows: &mut [(&mut SequenceCache, &[u32])],
    ) -> Result<Vec<Tensor>, VerifierError> {
        let mut inputs: Vec<BlockInput<'_>> = rows
            .iter_mut()
            .map(|(cache, tokens)| BlockInput { cache, tokens })
            .collect();
        Ok(self.model.forward(&mut inputs, OutputRows::All)?)
    }

    fn logits(&self, hidden: &Tensor) -> Result<Tensor, VerifierError> {
        Ok(self.model.logits(hidden)?)
    }

    fn truncate(&self, cache: &mut SequenceCache, len: usize) -> Result<(), VerifierError> {
        Ok(cache.truncate(len)?)
    }

    fn shared_kv(
        &self,
        cache: &SequenceCache,
        from: usize,
        to: usize,
    ) -> Result<Option<SharedKv>, VerifierError> {
        Ok(Some(self.model.shared_kv(cache, from, to)?))
    }
}
