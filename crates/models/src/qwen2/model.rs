//! The quantized Qwen2 causal LM: GGUF loading and block / batched forward passes that return
//! logits (or final hidden states) for every position.

use std::path::Path;
use std::time::Instant;

use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};

use super::attend::RowSpan;
use super::cache::KvCache;
use super::config::Qwen2Config;
use super::error::{Qwen2Error, Result};
use super::gguf::{requantize_for_cpu, GgufFile};
use super::layer::{DecoderLayer, LoadContext};
use super::linear::{QLinear, RowModeProbe};
use super::rope::RotaryEmbedding;

#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// On CPU, re-encode matmul weights stored as Q4_1/Q5_0/Q5_1/Q8_1 as Q8_0 (their candle CPU
    /// kernels are scalar code, several times slower).
    pub requantize_slow_formats: bool,
    /// On CPU, make every matmul row-exact: dense weights use the fixed-order kernel, and each
    /// quantized weight shape is probed so that single rows take the block kernel where the
    /// two differ (see `linear`). A row's result then never depends on the rows beside it.
    pub row_invariant_matmul: bool,
    /// On CPU, use the fixed-order attention kernel instead of masked matmuls.
    pub exact_cpu_attention: bool,
    /// Run two tokens through the model at load time. candle repacks quantized weights for
    /// its CPU kernels on first use (seconds for a 1.5B model); this moves that cost from the
    /// first request into loading.
    pub warm_up: bool,
}

impl LoadOptions {
    /// For a drafter: its proposals never decide the output, so its rows need not be
    /// bit-identical across block shapes, and single-token steps may take the fastest kernel.
    pub fn drafter() -> Self {
        Self {
            row_invariant_matmul: false,
            ..Self::default()
        }
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            requantize_slow_formats: true,
            row_invariant_matmul: true,
            exact_cpu_attention: true,
            warm_up: true,
        }
    }
}

/// One sequence of a batched forward: its new tokens and its cache.
pub struct BlockRow<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut KvCache,
}

enum Embedding {
    /// Rows are dequantized on lookup.
    Quantized(QTensor),
    /// Used when the row length is not a whole number of quantization blocks.
    Dense(Tensor),
}

pub struct Qwen2Model {
    config: Qwen2Config,
    embedding: Embedding,
    layers: Vec<DecoderLayer>,
    output_norm: Tensor,
    lm_head: QLinear,
    rope: RotaryEmbedding,
    device: Device,
    exact_cpu_attention: bool,
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
            return Err(Qwen2Error::TensorShape {
                name: "token_embd.weight".into(),
                expected: vec![0, 0],
                found: embed_dims,
            });
        };
        let config = Qwen2Config::from_metadata(gguf.metadata(), vocab_size)?;
        let hidden = config.hidden_size;
        let embed = gguf.qtensor("token_embd.weight", &[vocab_size, hidden], device)?;
        let embedding = if hidden % embed.dtype().block_size() == 0 {
            Embedding::Quantized(embed)
        } else {
            Embedding::Dense(embed.dequantize(device)?)
        };

        let mut ctx = LoadContext {
            gguf,
            device,
            requantize: options.requantize_slow_formats,
            probe: RowModeProbe::new(options.row_invariant_matmul),
            requantized: 0,
        };
        let layers = (0..config.num_layers)
            .map(|i| DecoderLayer::load(&mut ctx, i, &config))
            .collect::<Result<Vec<_>>>()?;
        let output_norm = ctx.norm("output_norm", hidden)?;
        let lm_head = if ctx.gguf.has_tensor("output.weight") {
            ctx.linear("output", vocab_size, hidden, false)?
        } else {
            // Tied head: the embedding matrix again, as a matmul weight of its own.
            let name = "token_embd.weight";
            let weight = ctx.gguf.qtensor(name, &[vocab_size, hidden], device)?;
            let weight = match options.requantize_slow_formats {
                true => requantize_for_cpu(name, weight, device)?,
                false => weight,
            };
            QLinear::new(name, weight, None, &mut ctx.probe)?
        };
        let (path, requantized) = (ctx.gguf.path().to_path_buf(), ctx.requantized);
        let model = Self {
            rope: RotaryEmbedding::new(config.head_dim, config.rope_theta),
            config,
            embedding,
            layers,
            output_norm,
            lm_head,
            device: device.clone(),
            exact_cpu_attention: options.exact_cpu_attention,
        };
        if options.warm_up {
            // One block of two and one single token reach both the block and the single-row
            // kernels.
            let mut cache = model.new_cache()?;
            model.forward_block(&[0, 0], &mut cache)?;
            model.forward_block(&[0], &mut cache)?;
        }
        tracing::info!(
            path = %path.display(),
            layers = model.config.num_layers,
            hidden,
            warmed_up = options.warm_up,
            vocab_size,
            requantized_to_q8_0 = requantized,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "loaded Qwen2 GGUF"
        );
        Ok(model)
    }

    pub fn config(&self) -> &Qwen2Config {
        &self.config
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// An empty cache for one sequence of this model.
    pub fn new_cache(&self) -> Result<KvCache> {
        let c = &self.config;
        KvCache::new(
            c.num_layers,
            c.num_kv_heads,
            c.head_dim,
            c.context_length,
            &self.device,
        )
    }

    /// Runs `tokens` after the cache's contents; logits `[tokens.len(), vocab]` for every one.
    pub fn forward_block(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        self.logits(&self.forward_block_hidden(tokens, cache)?)
    }

    /// Like `forward_block`, returning the final-normed hidden states `[tokens.len(), hidden]`.
    pub fn forward_block_hidden(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        let (hidden, _) = self.forward_packed(&mut [BlockRow { tokens, cache }])?;
        Ok(hidden)
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

    /// Like `forward_batch`, returning each row's final-normed hidden states.
    pub fn forward_batch_hidden(&self, rows: &mut [BlockRow<'_>]) -> Result<Vec<Tensor>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let (hidden, spans) = self.forward_packed(rows)?;
        Ok(spans
            .iter()
            .map(|s| hidden.narrow(0, s.start, s.len))
            .collect::<candle_core::Result<_>>()?)
    }

    /// The LM head: final-normed hidden states `[n, hidden]` to logits `[n, vocab]`.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        match hidden.dims() {
            [_, h] if *h == self.config.hidden_size => self.lm_head.forward(hidden),
            found => Err(Qwen2Error::HiddenShape {
                hidden_size: self.config.hidden_size,
                found: found.to_vec(),
            }),
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
            row.cache
                .check_fits(r, c.num_layers, c.num_kv_heads, c.head_dim, &self.device)?;
        }
        Ok(())
    }

    /// The packed forward: all rows' tokens as one `[tokens, hidden]` matrix, so every matmul
    /// runs once for the whole batch; only attention looks at row boundaries.
    fn forward_packed(&self, rows: &mut [BlockRow<'_>]) -> Result<(Tensor, Vec<RowSpan>)> {
        self.validate(rows)?;
        let mut spans = Vec::with_capacity(rows.len());
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        for row in rows.iter_mut() {
            let past = row.cache.len();
            row.cache.reserve(past + row.tokens.len())?;
            spans.push(RowSpan {
                start: ids.len(),
                len: row.tokens.len(),
                past,
            });
            ids.extend_from_slice(row.tokens);
            positions.extend(past..past + row.tokens.len());
        }
        let ids = Tensor::new(ids.as_slice(), &self.device)?;
        let mut x = match &self.embedding {
            Embedding::Quantized(q) => q.embedding(&ids)?,
            Embedding::Dense(t) => t.index_select(&ids, 0)?,
        };
        let cos_sin = self.rope.cos_sin(&positions, &self.device)?;
        {
            let caches: Vec<&KvCache> = rows.iter().map(|r| &*r.cache).collect();
            for (i, layer) in self.layers.iter().enumerate() {
                x = layer.forward(&x, &cos_sin, &spans, &caches, i, self.exact_cpu_attention)?;
            }
        }
        let hidden =
            candle_nn::ops::rms_norm(&x, &self.output_norm, self.config.rms_norm_eps as f32)?;
        for row in rows.iter_mut() {
            row.cache.commit(row.tokens.len());
        }
        Ok((hidden, spans))
    }
}
