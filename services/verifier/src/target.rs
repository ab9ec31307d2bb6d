//! The target models a verifier can run.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use specd_models::gemma4::{
    BlockInput, Gemma4Model, OutputRows, SequenceCache, SharedKv, DEFAULT_PREFILL_CHUNK,
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
    /// Fills the cache with the prompt; returns the last position's hidden `[1, hidden]`.
    fn prefill(&self, cache: &mut Self::Cache, tokens: &[u32]) -> Result<Tensor, VerifierError>;
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

    fn prefill(&self, cache: &mut SequenceCache, tokens: &[u32]) -> Result<Tensor, VerifierError> {
        Ok(self.model.prefill(cache, tokens, self.prefill_chunk)?)
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
