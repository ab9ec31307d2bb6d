//! The Qwen2 (GGUF) target: the real Qwen2.5-Coder model of the demo and benchmarks.

use std::path::Path;

use candle_core::{Device, Tensor};
use specd_models::gemma4::SharedKv;
use specd_models::qwen2::{BlockRow, KvCache, LoadOptions, Qwen2Error, Qwen2Model};

use crate::error::VerifierError;
use crate::target::TargetModel;

/// Rows a prompt is prefilled in at most.
const PREFILL_CHUNK: usize = 256;

pub struct Qwen2Target {
    model: Qwen2Model,
    eos: Vec<u32>,
}

fn model_error(e: Qwen2Error) -> VerifierError {
    VerifierError::Model(specd_models::ModelError::Invalid(e.to_string()))
}

impl Qwen2Target {
    /// Loads a GGUF file; `eos` are the end-of-sequence ids (from its tokenizer).
    pub fn load(path: &Path, device: &Device, eos: Vec<u32>) -> Result<Self, VerifierError> {
        let model =
            Qwen2Model::load_with(path, device, &LoadOptions::default()).map_err(model_error)?;
        Ok(Self { model, eos })
    }

    pub fn model(&self) -> &Qwen2Model {
        &self.model
    }
}

impl TargetModel for Qwen2Target {
    type Cache = KvCache;

    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn max_context(&self) -> usize {
        self.model.config().context_length
    }

    fn eos_token_ids(&self) -> Vec<u32> {
        self.eos.clone()
    }

    fn new_cache(&self) -> Result<KvCache, VerifierError> {
        self.model.new_cache().map_err(model_error)
    }

    fn cache_len(&self, cache: &KvCache) -> usize {
        cache.len()
    }

    fn cache_bytes(&self, cache: &KvCache) -> usize {
        let c = self.model.config();
        2 * c.num_layers * c.num_kv_heads * c.head_dim * cache.capacity() * 4
    }

    fn kv_bytes_bound(&self, tokens: usize) -> usize {
        let c = self.model.config();
        2 * c.num_layers * c.num_kv_heads * c.head_dim * tokens * 4
    }

    fn prefill_chunk_len(&self) -> usize {
        PREFILL_CHUNK
    }

    fn prefill_piece(
        &self,
        cache: &mut KvCache,
        piece: &[u32],
        last: bool,
    ) -> Result<Option<Tensor>, VerifierError> {
        let hidden = self
            .model
            .forward_block_hidden(piece, cache)
            .map_err(model_error)?;
        if !last {
            return Ok(None);
        }
        let n = hidden.dims()[0];
        if n == 0 {
            return Err(VerifierError::invalid("prompt_ids", "must not be empty"));
        }
        Ok(Some(hidden.narrow(0, n - 1, 1)?))
    }

    fn forward_blocks(
        &self,
        rows: &mut [(&mut KvCache, &[u32])],
    ) -> Result<Vec<Tensor>, VerifierError> {
        let mut inputs: Vec<BlockRow<'_>> = rows
            .iter_mut()
            .map(|(cache, tokens)| BlockRow { tokens, cache })
            .collect();
        self.model
            .forward_batch_hidden(&mut inputs)
            .map_err(model_error)
    }

    fn logits(&self, hidden: &Tensor) -> Result<Tensor, VerifierError> {
        self.model.logits(hidden).map_err(model_error)
    }

    fn truncate(&self, cache: &mut KvCache, len: usize) -> Result<(), VerifierError> {
        cache.truncate(len).map_err(model_error)
    }

    fn shared_kv(
        &self,
        _cache: &KvCache,
        _from: usize,
        _to: usize,
    ) -> Result<Option<SharedKv>, VerifierError> {
        Ok(None)
    }
}
