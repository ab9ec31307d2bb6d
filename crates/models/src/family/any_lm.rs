//! One causal LM type for every family: what a loader of the registry returns, so that the
//! verifier, the drafter and the CLI hold one model type whatever checkpoint they were given.
//! A call costs one virtual dispatch (and, for a forward, one small vector of typed rows),
//! nothing beside the forward itself.

use std::any::Any;

use candle_core::{Device, Tensor};

use crate::causal_lm::{CausalLm, OutputRows, PrefixReuse, SeqBlock, TopTwo};
use crate::error::{ModelError, Result};
use crate::shared_kv::SharedKv;

/// A causal LM of any family.
pub struct AnyLm(Box<dyn ErasedLm>);

/// A cache of an [`AnyLm`]: the family's own cache inside.
pub struct AnyCache(Box<dyn Any + Send>);

impl AnyLm {
    pub fn new<M: CausalLm>(model: M) -> Self {
        Self(Box::new(model))
    }
}

impl std::fmt::Debug for AnyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AnyCache")
    }
}

fn typed<C: 'static>(cache: &AnyCache) -> Result<&C> {
    cache.0.downcast_ref().ok_or_else(foreign_cache)
}

fn typed_mut<C: 'static>(cache: &mut AnyCache) -> Result<&mut C> {
    cache.0.downcast_mut().ok_or_else(foreign_cache)
}

fn foreign_cache() -> ModelError {
    ModelError::Invalid("a cache made by another model".into())
}

/// [`CausalLm`] with the cache type erased; every method forwards to the family's own, so
/// its specialised kernels (argmax without logits, runner-ups) stay in use.
trait ErasedLm: Send + Sync + 'static {
    fn vocab_size(&self) -> usize;
    fn max_context(&self) -> usize;
    fn device(&self) -> &Device;
    fn default_prefill_chunk(&self) -> usize;
    fn new_cache(&self, max_rollback: usize) -> Result<AnyCache>;
    fn cache_len(&self, cache: &AnyCache) -> usize;
    fn cache_bytes(&self, cache: &AnyCache) -> usize;
    fn kv_bytes_bound(&self, tokens: usize, chunk: usize, max_rollback: usize) -> usize;
    fn forward(
        &self,
        rows: &mut [SeqBlock<'_, AnyCache>],
        output: OutputRows,
    ) -> Result<Vec<Tensor>>;
    fn logits(&self, hidden: &Tensor) -> Result<Tensor>;
    fn argmax(&self, hidden: &Tensor) -> Result<Vec<u32>>;
    fn argmax_below(&self, hidden: &Tensor, below: usize) -> Result<Vec<u32>>;
    fn top_two_below(&self, hidden: &Tensor, below: usize) -> Result<Vec<TopTwo>>;
    fn truncate(&self, cache: &mut AnyCache, len: usize) -> Result<()>;
    fn supports_trees(&self) -> bool;
    fn computes_every_row(&self) -> bool;
    fn keep_path(&self, cache: &mut AnyCache, start: usize, path: &[usize]) -> Result<()>;
    fn copy_prefix(
        &self,
        source: &AnyCache,
        target: &mut AnyCache,
        shared: usize,
        len: usize,
    ) -> Result<bool>;
    fn prefix_reuse(&self) -> PrefixReuse;
    fn cache_prefix(
        &self,
        source: &AnyCache,
        len: usize,
        max_rollback: usize,
    ) -> Result<Option<AnyCache>>;
    fn shared_kv(&self, cache: &AnyCache, from: usize, to: usize) -> Result<Option<SharedKv>>;
}

impl<M: CausalLm> ErasedLm for M {
    fn vocab_size(&self) -> usize {
        CausalLm::vocab_size(self)
    }

    fn max_context(&self) -> usize {
        CausalLm::max_context(self)
    }

    fn device(&self) -> &Device {
        CausalLm::device(self)
    }

    fn default_prefill_chunk(&self) -> usize {
        CausalLm::default_prefill_chunk(self)
    }

    fn new_cache(&self, max_rollback: usize) -> Result<AnyCache> {
        Ok(AnyCache(Box::new(CausalLm::new_cache(self, max_rollback)?)))
    }

    fn cache_len(&self, cache: &AnyCache) -> usize {
        // A foreign cache holds nothing of this model's.
        typed(cache).map_or(0, |c| CausalLm::cache_len(self, c))
    }

    fn cache_bytes(&self, cache: &AnyCache) -> usize {
        typed(cache).map_or(0, |c| CausalLm::cache_bytes(self, c))
    }

    fn kv_bytes_bound(&self, tokens: usize, chunk: usize, max_rollback: usize) -> usize {
        CausalLm::kv_bytes_bound(self, tokens, chunk, max_rollback)
    }

    fn forward(
        &self,
        rows: &mut [SeqBlock<'_, AnyCache>],
        output: OutputRows,
    ) -> Result<Vec<Tensor>> {
        let mut own = rows
            .iter_mut()
            .map(|row| {
                Ok(SeqBlock {
                    cache: typed_mut::<M::Cache>(row.cache)?,
                    tokens: row.tokens,
                    parents: row.parents,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        CausalLm::forward(self, &mut own, output)
    }

    fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        CausalLm::logits(self, hidden)
    }

    fn argmax(&self, hidden: &Tensor) -> Result<Vec<u32>> {
        CausalLm::argmax(self, hidden)
    }

    fn argmax_below(&self, hidden: &Tensor, below: usize) -> Result<Vec<u32>> {
        CausalLm::argmax_below(self, hidden, below)
    }

    fn top_two_below(&self, hidden: &Tensor, below: usize) -> Result<Vec<TopTwo>> {
        CausalLm::top_two_below(self, hidden, below)
    }

    fn truncate(&self, cache: &mut AnyCache, len: usize) -> Result<()> {
        CausalLm::truncate(self, typed_mut(cache)?, len)
    }

    fn supports_trees(&self) -> bool {
        CausalLm::supports_trees(self)
    }

    fn computes_every_row(&self) -> bool {
        CausalLm::computes_every_row(self)
    }

    fn keep_path(&self, cache: &mut AnyCache, start: usize, path: &[usize]) -> Result<()> {
        CausalLm::keep_path(self, typed_mut(cache)?, start, path)
    }

    fn copy_prefix(
        &self,
        source: &AnyCache,
        target: &mut AnyCache,
        shared: usize,
        len: usize,
    ) -> Result<bool> {
        CausalLm::copy_prefix(self, typed(source)?, typed_mut(target)?, shared, len)
    }

    fn prefix_reuse(&self) -> PrefixReuse {
        CausalLm::prefix_reuse(self)
    }

    fn cache_prefix(
        &self,
        source: &AnyCache,
        len: usize,
        max_rollback: usize,
    ) -> Result<Option<AnyCache>> {
        Ok(
            CausalLm::cache_prefix(self, typed(source)?, len, max_rollback)?
                .map(|cache| AnyCache(Box::new(cache))),
        )
    }

    fn shared_kv(&self, cache: &AnyCache, from: usize, to: usize) -> Result<Option<SharedKv>> {
        CausalLm::shared_kv(self, typed(cache)?, from, to)
    }
}

impl CausalLm for AnyLm {
    type Cache = AnyCache;

    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }

    fn max_context(&self) -> usize {
        self.0.max_context()
    }

    fn device(&self) -> &Device {
        self.0.device()
    }

    fn default_prefill_chunk(&self) -> usize {
        self.0.default_prefill_chunk()
    }

    fn new_cache(&self, max_rollback: usize) -> Result<AnyCache> {
        self.0.new_cache(max_rollback)
    }

    fn cache_len(&self, cache: &AnyCache) -> usize {
        self.0.cache_len(cache)
    }

    fn cache_bytes(&self, cache: &AnyCache) -> usize {
        self.0.cache_bytes(cache)
    }

    fn kv_bytes_bound(&self, tokens: usize, chunk: usize, max_rollback: usize) -> usize {
        self.0.kv_bytes_bound(tokens, chunk, max_rollback)
    }

    fn forward(
        &self,
        rows: &mut [SeqBlock<'_, AnyCache>],
        output: OutputRows,
    ) -> Result<Vec<Tensor>> {
        self.0.forward(rows, output)
    }

    fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.0.logits(hidden)
    }

    fn argmax(&self, hidden: &Tensor) -> Result<Vec<u32>> {
        self.0.argmax(hidden)
    }

    fn argmax_below(&self, hidden: &Tensor, below: usize) -> Result<Vec<u32>> {
        self.0.argmax_below(hidden, below)
    }

    fn top_two_below(&self, hidden: &Tensor, below: usize) -> Result<Vec<TopTwo>> {
        self.0.top_two_below(hidden, below)
    }

    fn truncate(&self, cache: &mut AnyCache, len: usize) -> Result<()> {
        self.0.truncate(cache, len)
    }

    fn supports_trees(&self) -> bool {
        self.0.supports_trees()
    }

    fn computes_every_row(&self) -> bool {
        self.0.computes_every_row()
    }

    fn keep_path(&self, cache: &mut AnyCache, start: usize, path: &[usize]) -> Result<()> {
        self.0.keep_path(cache, start, path)
    }

    fn copy_prefix(
        &self,
        source: &AnyCache,
        target: &mut AnyCache,
        shared: usize,
        len: usize,
    ) -> Result<bool> {
        self.0.copy_prefix(source, target, shared, len)
    }

    fn prefix_reuse(&self) -> PrefixReuse {
        self.0.prefix_reuse()
    }

    fn cache_prefix(
        &self,
        source: &AnyCache,
        len: usize,
        max_rollback: usize,
    ) -> Result<Option<AnyCache>> {
        self.0.cache_prefix(source, len, max_rollback)
    }

    fn shared_kv(&self, cache: &AnyCache, from: usize, to: usize) -> Result<Option<SharedKv>> {
        self.0.shared_kv(cache, from, to)
    }
}
