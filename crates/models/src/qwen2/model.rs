//! The quantized Qwen2 causal LM: GGUF loading and block / batched forward passes that return
//! logits (or final hidden states) for every position.
//!
//! On CPU it runs on the crate's own engine (`engine`); on other devices on candle.

use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};

use super::cache::{KvCache, KvStore};
use super::candle::{CandleQwen2, CandleRow};
use super::config::Qwen2Config;
use super::engine::{Engine, EngineRow};
use super::error::{Qwen2Error, Result};
use crate::causal_lm::{top_two_with, CausalLm, OutputRows, PrefixReuse, SeqBlock, TopTwo};
use crate::cpu::Span;
use crate::error::ModelError;
use crate::gguf::{GgufError, GgufFile};
use crate::precision::MatrixPrecision;

/// Which implementation runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// The CPU engine on CPU, candle elsewhere.
    #[default]
    Auto,
    /// candle's tensors and quantized matmuls, on any device (on CPU: a reference to compare
    /// the engine with; its rows are not independent of the block they run in).
    Candle,
}

#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub backend: Backend,
    /// With candle: run two tokens through the model at load time, so that candle's
    /// one-time weight repacking happens before the first request.
    pub warm_up: bool,
    /// The precision the CPU engine runs the matrices in (candle runs them as stored).
    pub precision: MatrixPrecision,
}

/// What the CPU engine runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInfo {
    /// The kernel set (`avx512-vnni`, `avx-vnni`, `avx2`, `portable`).
    pub kernels: &'static str,
    pub threads: usize,
    /// Weight bytes one decode step streams.
    pub streamed_bytes: usize,
    /// Weight bytes held in memory (the streamed ones and the token embedding).
    pub resident_bytes: usize,
    /// Matmul weights stored in a format without a native kernel, re-encoded at load.
    pub reencoded_tensors: usize,
    /// Matmul weights re-encoded narrower at load ([`LoadOptions::precision`]).
    pub narrowed_tensors: usize,
}

/// One sequence of a batched forward: its new tokens and its cache.
pub type BlockRow<'a> = SeqBlock<'a, KvCache>;

/// Rows a prompt is prefilled in at most.
pub const PREFILL_CHUNK: usize = 256;

enum Runner {
    Engine(Box<Engine>),
    Candle(Box<CandleQwen2>),
}

pub struct Qwen2Model {
    config: Qwen2Config,
    runner: Runner,
    device: Device,
}

impl Qwen2Model {
    pub fn load(path: &Path, device: &Device) -> Result<Self> {
        Self::load_with(path, device, &LoadOptions::default())
    }

    pub fn load_with(path: &Path, device: &Device, options: &LoadOptions) -> Result<Self> {
        let mut gguf = GgufFile::open(path)?;
        Self::from_gguf(&mut gguf, device, options)
    }

    pub fn from_gguf(gguf: &mut GgufFile, device: &Device, options: &LoadOptions) -> Result<Self> {
        let started = Instant::now();
        let embed_dims = gguf.tensor_dims("token_embd.weight")?;
        let [vocab_size, _] = embed_dims[..] else {
            return Err(GgufError::TensorShape {
                name: "token_embd.weight".into(),
                expected: vec![0, 0],
                found: embed_dims,
            }
            .into());
        };
        let mut config = Qwen2Config::from_metadata(gguf.metadata(), vocab_size)?;
        config.rope_freq_factors = super::config::rope_freq_factors(gguf, config.head_dim / 2)?;
        let runner = match options.backend {
            Backend::Auto if device.is_cpu() => Runner::Engine(Box::new(Engine::load(
                gguf,
                config.clone(),
                options.precision,
            )?)),
            _ => Runner::Candle(Box::new(CandleQwen2::load(gguf, &config, device)?)),
        };
        let model = Self {
            config,
            runner,
            device: device.clone(),
        };
        if options.warm_up && matches!(model.runner, Runner::Candle(_)) {
            let mut cache = model.new_cache()?;
            model.forward_block(&[0, 0], &mut cache)?;
            model.forward_block(&[0], &mut cache)?;
        }
        let info = model.engine_info();
        tracing::info!(
            path = %gguf.path().display(),
            layers = model.config.num_layers,
            hidden = model.config.hidden_size,
            vocab_size,
            kernels = info.as_ref().map_or("candle", |i| i.kernels),
            threads = info.as_ref().map(|i| i.threads),
            weight_bytes = info.as_ref().map(|i| i.resident_bytes),
            narrowed = info.as_ref().map(|i| i.narrowed_tensors),
            elapsed_ms = started.elapsed().as_millis() as u64,
            architecture = model.config.architecture.name,
            "loaded GGUF decoder"
        );
        Ok(model)
    }

    pub fn config(&self) -> &Qwen2Config {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The CPU engine's kernel set, threads and weight bytes; `None` on candle.
    pub fn engine_info(&self) -> Option<EngineInfo> {
        match &self.runner {
            Runner::Engine(e) => Some(EngineInfo {
                kernels: e.isa().name(),
                threads: e.threads(),
                streamed_bytes: e.streamed_bytes(),
                resident_bytes: e.resident_bytes(),
                reencoded_tensors: e.reencoded(),
                narrowed_tensors: e.narrowed(),
            }),
            Runner::Candle(_) => None,
        }
    }

    /// An empty cache for one sequence of this model.
    pub fn new_cache(&self) -> Result<KvCache> {
        let c = &self.config;
        KvCache::new(
            c.num_layers,
            c.num_kv_heads,
            c.head_dim,
            c.context_length,
            self.cache_device(),
        )
    }

    /// Runs `tokens` after the cache's contents; logits `[tokens.len(), vocab]` for every one.
    pub fn forward_block(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        self.logits(&self.forward_block_hidden(tokens, cache)?)
    }

    /// Like `forward_block`, returning the final-normed hidden states `[tokens.len(), hidden]`.
    pub fn forward_block_hidden(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        let (hidden, _) = self.forward_packed(&mut [BlockRow::chain(cache, tokens)])?;
        Ok(hidden)
    }

    /// Runs `tokens` after the cache's contents and returns the greedy next token after the
    /// last one, without materialising the logits on CPU.
    pub fn forward_block_argmax(&self, tokens: &[u32], cache: &mut KvCache) -> Result<u32> {
        let hidden = self.forward_block_hidden(tokens, cache)?;
        let last = hidden.narrow(0, hidden.dim(0)? - 1, 1)?;
        Ok(self.argmax(&last)?[0])
    }

    /// Runs several sequences in one forward; each row may have its own length and position.
    /// Returns each row's logits `[row.tokens.len(), vocab]`, equal to running the row alone.
    pub fn forward_batch(&self, rows: &mut [BlockRow<'_>]) -> Result<Vec<Tensor>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let (hidden, spans) = self.forward_packed(rows)?;
        let logits = self.logits(&hidden)?;
        Ok(spans
            .iter()
            .map(|s| logits.narrow(0, s.start, s.len))
            .collect::<candle_core::Result<_>>()?)
    }

    fn check_hidden(&self, hidden: &Tensor) -> Result<usize> {
        match hidden.dims() {
            [n, h] if *h == self.config.hidden_size => Ok(*n),
            found => Err(Qwen2Error::HiddenShape {
                hidden_size: self.config.hidden_size,
                found: found.to_vec(),
            }),
        }
    }

    /// The LM head: final-normed hidden states `[n, hidden]` to logits `[n, vocab]`.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let n = self.check_hidden(hidden)?;
        match &self.runner {
            Runner::Engine(e) => {
                let values = hidden_values(hidden)?;
                let logits = e.logits(&values);
                Ok(Tensor::from_vec(
                    logits,
                    (n, self.config.vocab_size),
                    &Device::Cpu,
                )?)
            }
            Runner::Candle(c) => c.logits(hidden),
        }
    }

    /// The greedy token of each hidden state `[n, hidden]` (the lowest id among equal
    /// logits); on CPU the logits are never materialised.
    pub fn argmax(&self, hidden: &Tensor) -> Result<Vec<u32>> {
        self.argmax_below(hidden, self.config.vocab_size)
    }

    /// [`Self::argmax`] among the ids below `below` only (at least 1, at most the
    /// vocabulary); on CPU the head's rows past `below` are never read.
    pub fn argmax_below(&self, hidden: &Tensor, below: usize) -> Result<Vec<u32>> {
        self.check_hidden(hidden)?;
        let below = below.clamp(1, self.config.vocab_size);
        match &self.runner {
            Runner::Engine(e) => Ok(e.argmax(&hidden_values(hidden)?, below)),
            Runner::Candle(c) => Ok(c
                .logits(hidden)?
                .narrow(1, 0, below)?
                .to_dtype(DType::F32)?
                .argmax(1)?
                .to_vec1::<u32>()?),
        }
    }

    /// [`Self::argmax_below`] (the same tokens) and each row's runner-up, with their
    /// logits; on CPU from the same single pass over the head.
    pub fn top_two_below(&self, hidden: &Tensor, below: usize) -> Result<Vec<TopTwo>> {
        self.check_hidden(hidden)?;
        let below = below.clamp(1, self.config.vocab_size);
        match &self.runner {
            Runner::Engine(e) => Ok(e.top_two(&hidden_values(hidden)?, below)),
            Runner::Candle(_) => {
                let greedy = self.argmax_below(hidden, below)?;
                let logits = self
                    .logits(hidden)?
                    .narrow(1, 0, below)?
                    .to_dtype(DType::F32)?
                    .to_vec2::<f32>()?;
                Ok(greedy
                    .into_iter()
                    .zip(&logits)
                    .map(|(best, row)| top_two_with(best, row))
                    .collect())
            }
        }
    }

    /// Where this model's caches live: host memory (`None`) or its candle device.
    fn cache_device(&self) -> Option<&Device> {
        match self.runner {
            Runner::Engine(_) => None,
            Runner::Candle(_) => Some(&self.device),
        }
    }

    fn validate(&self, rows: &[BlockRow<'_>]) -> Result<()> {
        let c = &self.config;
        for (r, row) in rows.iter().enumerate() {
            if row.tokens.is_empty() {
                return Err(Qwen2Error::EmptyBlock { row: r });
            }
            if let Some((index, &id)) = row
                .tokens
                .iter()
                .enumerate()
                .find(|(_, &id)| id as usize >= c.vocab_size)
            {
                return Err(Qwen2Error::TokenOutOfRange {
                    row: r,
                    index,
                    id,
                    vocab_size: c.vocab_size,
                });
            }
            let needed = row.cache.len() + row.tokens.len();
            if needed > c.context_length {
                return Err(Qwen2Error::ContextOverflow {
                    row: r,
                    needed,
                    context_length: c.context_length,
                });
            }
            if !row.parents.is_empty() {
                crate::tree::check_block(row.parents, row.tokens.len(), row.cache.len())
                    .map_err(|message| Qwen2Error::Tree { row: r, message })?;
            }
            row.cache.check_fits(
                r,
                c.num_layers,
                c.num_kv_heads,
                c.head_dim,
                self.cache_device(),
            )?;
        }
        Ok(())
    }

    /// The packed forward of all rows; returns the final-normed hidden states of every
    /// token, rows in order.
    fn forward_packed(&self, rows: &mut [BlockRow<'_>]) -> Result<(Tensor, Vec<Span>)> {
        self.validate(rows)?;
        let spans = Span::pack(rows.iter().map(|row| (row.tokens.len(), row.cache.len())));
        for (row, span) in rows.iter_mut().zip(&spans) {
            row.cache.reserve(span.positions().end)?;
        }
        let tokens: usize = spans.iter().map(|s| s.len).sum();
        let hidden = match &self.runner {
            Runner::Engine(e) => {
                let mut engine_rows: Vec<EngineRow<'_>> = rows
                    .iter_mut()
                    .map(|row| {
                        let past = row.cache.len();
                        let KvStore::Host(kv) = &mut row.cache.store else {
                            unreachable!("checked in validate")
                        };
                        EngineRow {
                            tokens: row.tokens,
                            parents: row.parents,
                            kv,
                            past,
                        }
                    })
                    .collect();
                let values = e.forward(&mut engine_rows);
                Tensor::from_vec(values, (tokens, self.config.hidden_size), &Device::Cpu)?
            }
            Runner::Candle(c) => {
                let candle_rows: Vec<CandleRow<'_>> = rows
                    .iter()
                    .map(|row| {
                        let KvStore::Device(kv) = &row.cache.store else {
                            unreachable!("checked in validate")
                        };
                        CandleRow {
                            tokens: row.tokens,
                            parents: row.parents,
                            kv,
                            past: row.cache.len(),
                        }
                    })
                    .collect();
                c.forward(&candle_rows)?
            }
        };
        for row in rows.iter_mut() {
            row.cache.commit(row.tokens.len());
        }
        Ok((hidden, spans))
    }
}

fn hidden_values(hidden: &Tensor) -> Result<Vec<f32>> {
    Ok(hidden
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

impl CausalLm for Qwen2Model {
    type Cache = KvCache;

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_context(&self) -> usize {
        self.config.context_length
    }

    fn device(&self) -> &Device {
        Qwen2Model::device(self)
    }

    fn default_prefill_chunk(&self) -> usize {
        PREFILL_CHUNK
    }

    fn new_cache(&self, _max_rollback: usize) -> std::result::Result<KvCache, ModelError> {
        Ok(Qwen2Model::new_cache(self)?)
    }

    fn cache_len(&self, cache: &KvCache) -> usize {
        cache.len()
    }

    fn cache_bytes(&self, cache: &KvCache) -> usize {
        cache.allocated_bytes()
    }

    fn kv_bytes_bound(&self, tokens: usize, _chunk: usize, _max_rollback: usize) -> usize {
        let c = &self.config;
        2 * c.num_layers * c.num_kv_heads * c.head_dim * tokens * 4
    }

    fn forward(
        &self,
        rows: &mut [SeqBlock<'_, KvCache>],
        output: OutputRows,
    ) -> std::result::Result<Vec<Tensor>, ModelError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let (hidden, spans) = self.forward_packed(rows)?;
        let pick = |s: &Span| match output {
            OutputRows::All => Some(hidden.narrow(0, s.start, s.len)),
            OutputRows::Last => Some(hidden.narrow(0, s.start + s.len - 1, 1)),
            OutputRows::None => None,
        };
        Ok(spans
            .iter()
            .filter_map(pick)
            .collect::<candle_core::Result<_>>()?)
    }

    fn logits(&self, hidden: &Tensor) -> std::result::Result<Tensor, ModelError> {
        Ok(Qwen2Model::logits(self, hidden)?)
    }

    fn argmax(&self, hidden: &Tensor) -> std::result::Result<Vec<u32>, ModelError> {
        Ok(Qwen2Model::argmax(self, hidden)?)
    }

    fn argmax_below(
        &self,
        hidden: &Tensor,
        below: usize,
    ) -> std::result::Result<Vec<u32>, ModelError> {
        Ok(Qwen2Model::argmax_below(self, hidden, below)?)
    }

    fn top_two_below(
        &self,
        hidden: &Tensor,
        below: usize,
    ) -> std::result::Result<Vec<TopTwo>, ModelError> {
        Ok(Qwen2Model::top_two_below(self, hidden, below)?)
    }

    fn truncate(&self, cache: &mut KvCache, len: usize) -> std::result::Result<(), ModelError> {
        Ok(cache.truncate(len)?)
    }

    fn supports_trees(&self) -> bool {
        true
    }

    fn computes_every_row(&self) -> bool {
        true
    }

    fn keep_path(
        &self,
        cache: &mut KvCache,
        start: usize,
        path: &[usize],
    ) -> std::result::Result<(), ModelError> {
        Ok(cache.keep_path(start, path)?)
    }

    fn copy_prefix(
        &self,
        source: &KvCache,
        target: &mut KvCache,
        shared: usize,
        len: usize,
    ) -> std::result::Result<bool, ModelError> {
        Ok(target.copy_prefix(source, shared, len)?)
    }

    fn prefix_reuse(&self) -> PrefixReuse {
        // The engine computes each output element by one fixed sequence of operations
        // whatever the rows beside it; candle's kernels do not promise that.
        match self.runner {
            Runner::Engine(_) => PrefixReuse::AnyLength,
            Runner::Candle(_) => PrefixReuse::Never,
        }
    }

    fn cache_prefix(
        &self,
        source: &KvCache,
        len: usize,
        _max_rollback: usize,
    ) -> std::result::Result<Option<KvCache>, ModelError> {
        if len > source.len() {
            return Ok(None);
        }
        let mut cache = Qwen2Model::new_cache(self)?;
        Ok(cache.copy_prefix(source, 0, len)?.then_some(cache))
    }
}
