//! The Gemma 4 text model (`Gemma4ForCausalLM`, or the language model of `Gemma4ForConditionalGeneration`).

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::cache::SequenceCache;
use super::config::{CheckpointLayout, Gemma4TextConfig, LayerKind};
use super::layer::{DecoderLayer, RowRope, RowSlot};
use super::norm::RmsNorm;
use super::rope::tables_by_layer;
use crate::blocks::rope::RotaryTable;
use crate::causal_lm::{greedy_token, CausalLm, OutputRows, PrefixReuse, SeqBlock};
use crate::checkpoint::Checkpoint;
use crate::cpu::ThreadPool;
use crate::embedding::EmbeddingTable;
use crate::error::{ModelError, Result};
use crate::exact::TreeQueries;
use crate::linear::{exact_eligible, Linear};
use crate::projection::{BestTwo, Projection};
use crate::shared_kv::SharedKv;

/// Rows a prompt is prefilled in at most, so one long prompt never runs as one huge forward.
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// A block of new tokens for one sequence.
pub type BlockInput<'a> = SeqBlock<'a, SequenceCache>;

struct PerLayerEmbedding {
    table: EmbeddingTable,
    model_projection: Projection,
    projection_norm: RmsNorm,
    width: usize,
}

pub struct Gemma4Model {
    cfg: Gemma4TextConfig,
    layout: CheckpointLayout,
    embed: EmbeddingTable,
    embed_scale: f64,
    per_layer: Option<PerLayerEmbedding>,
    layers: Vec<DecoderLayer>,
    ropes: Vec<((LayerKind, usize), RotaryTable)>,
    final_norm: RmsNorm,
    lm_head: Projection,
    device: Device,
    dtype: DType,
}

impl Gemma4Model {
    /// Loads a Gemma 4 text checkpoint: a directory (config.json plus safetensors) or a GGUF
    /// file of architecture `gemma4` (see [`super::gguf`]).
    pub fn load(path: &Path, dtype: DType, device: &Device) -> Result<Self> {
        if path.is_file() {
            let (cfg, layout, ckpt) = super::gguf::open(path, dtype, device)?;
            return Self::from_checkpoint(cfg, layout, &ckpt);
        }
        let (cfg, layout) = Gemma4TextConfig::from_dir(path)?;
        let ckpt = Checkpoint::open(path, dtype, device)?;
        Self::from_checkpoint(cfg, layout, &ckpt)
    }

    pub fn from_checkpoint(
        cfg: Gemma4TextConfig,
        layout: CheckpointLayout,
        ckpt: &Checkpoint,
    ) -> Result<Self> {
        let p = layout.text_prefix.clone();
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let tied = !ckpt.contains("lm_head.weight");
        if tied && !cfg.tie_word_embeddings {
            return Err(ModelError::MissingTensor {
                name: "lm_head.weight".into(),
            });
        }
        let (embed, packed_embed) =
            EmbeddingTable::load(ckpt, &format!("{p}embed_tokens.weight"), v, h, tied)?;
        let per_layer = match cfg.per_layer_input_size {
            Some(ple) => {
                let width = cfg.num_layers * ple;
                Some(PerLayerEmbedding {
                    table: EmbeddingTable::load(
                        ckpt,
                        &format!("{p}embed_tokens_per_layer.weight"),
                        cfg.per_layer_vocab_size,
                        width,
                        false,
                    )?
                    .0,
                    model_projection: Projection::load(
                        ckpt,
                        &format!("{p}per_layer_model_projection"),
                        width,
                        h,
                        false,
                    )?,
                    projection_norm: RmsNorm::new(
                        ckpt.tensor(&format!("{p}per_layer_projection_norm.weight"), &[ple])?,
                        cfg.rms_norm_eps,
                    ),
                    width: ple,
                })
            }
            None => None,
        };
        let layers = (0..cfg.num_layers)
            .map(|i| DecoderLayer::load(ckpt, &cfg, i, &p))
            .collect::<Result<Vec<_>>>()?;
        let ropes = tables_by_layer(&cfg);
        let final_norm = RmsNorm::new(
            ckpt.tensor(&format!("{p}norm.weight"), &[h])?,
            cfg.rms_norm_eps,
        );
        let lm_head = match (tied, packed_embed, embed.dense()) {
            (false, _, _) => Projection::load(ckpt, "lm_head", v, h, false)?,
            (true, Some(packed), _) => packed.into(),
            (true, None, Some(table)) => Linear::new(table.clone(), None).into(),
            (true, None, None) => {
                return Err(ModelError::Invalid(
                    "a quantized token embedding came back without its packed head".into(),
                ))
            }
        };
        Ok(Self {
            embed_scale: (h as f64).sqrt(),
            cfg,
            layout,
            embed,
            per_layer,
            layers,
            ropes,
            final_norm,
            lm_head,
            device: ckpt.device().clone(),
            dtype: ckpt.dtype(),
        })
    }

    pub fn config(&self) -> &Gemma4TextConfig {
        &self.cfg
    }

    pub fn layout(&self) -> &CheckpointLayout {
        &self.layout
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The token embedding table's raw weights `[vocab, hidden]` (unscaled).
    pub fn embedding_table(&self) -> &EmbeddingTable {
        &self.embed
    }

    /// A fresh cache for one sequence, able to roll back `max_rollback` tokens.
    pub fn new_cache(&self, max_rollback: usize) -> SequenceCache {
        SequenceCache::new(&self.cfg, max_rollback)
    }

    /// Runs a block of tokens for one sequence, returning the final-normed hidden state of
    /// every position `[tokens, hidden]`.
    pub fn forward_block(&self, cache: &mut SequenceCache, tokens: &[u32]) -> Result<Tensor> {
        let mut rows = [BlockInput::chain(cache, tokens)];
        let mut out = self.forward(&mut rows, OutputRows::All)?;
        out.pop()
            .ok_or_else(|| ModelError::Invalid("forward returned no rows".into()))
    }

    /// Prefills a prompt in chunks of at most `chunk` tokens and returns the final-normed
    /// hidden state of its last position `[1, hidden]`.
    pub fn prefill(
        &self,
        cache: &mut SequenceCache,
        tokens: &[u32],
        chunk: usize,
    ) -> Result<Tensor> {
        if tokens.is_empty() {
            return Err(ModelError::Invalid(
                "prompt_ids: the prompt is empty".into(),
            ));
        }
        let chunk = chunk.max(1);
        let mut last = None;
        let pieces: Vec<&[u32]> = tokens.chunks(chunk).collect();
        for (i, piece) in pieces.iter().enumerate() {
            let final_piece = i + 1 == pieces.len();
            let mut rows = [BlockInput::chain(&mut *cache, piece)];
            let mode = if final_piece {
                OutputRows::Last
            } else {
                OutputRows::None
            };
            last = self.forward(&mut rows, mode)?.pop();
        }
        last.ok_or_else(|| ModelError::Invalid("prefill returned no hidden state".into()))
    }

    /// One packed forward over several sequences, each with its own block of new tokens.
    /// Returns, per row, the final-normed hidden states of the positions `output` asks for.
    pub fn forward(&self, rows: &mut [BlockInput<'_>], output: OutputRows) -> Result<Vec<Tensor>> {
        let mut slots = Vec::with_capacity(rows.len());
        let mut ids = Vec::new();
        for (r, row) in rows.iter().enumerate() {
            if row.tokens.is_empty() {
                return Err(ModelError::Invalid(format!(
                    "rows[{r}].tokens: empty block"
                )));
            }
            for (i, &t) in row.tokens.iter().enumerate() {
                if t as usize >= self.cfg.vocab_size {
                    return Err(ModelError::Invalid(format!(
                        "rows[{r}].tokens[{i}]: token id {t} is not below the vocabulary size {}",
                        self.cfg.vocab_size
                    )));
                }
            }
            let position = row.cache.len();
            if position + row.tokens.len() > self.cfg.max_position_embeddings {
                return Err(ModelError::Invalid(format!(
                    "rows[{r}]: {} tokens exceed the context limit of {}",
                    position + row.tokens.len(),
                    self.cfg.max_position_embeddings
                )));
            }
            let tree = tree_of(r, row, output)?;
            slots.push(RowSlot {
                offset: ids.len(),
                tokens: row.tokens.len(),
                position,
                tree,
            });
            ids.extend_from_slice(row.tokens);
        }
        let max_block = slots.iter().map(|s| s.tokens).max().unwrap_or(0);
        let exact = exact_eligible(&self.device, self.dtype, max_block);

        let ids_t = Tensor::new(ids.as_slice(), &self.device)?;
        let mut h = (self.embed.lookup(&ids_t)? * self.embed_scale_in_dtype())?;
        let per_layer_inputs = self.per_layer_inputs(&ids_t, &h, exact)?;
        let mut ropes = self.row_ropes(&slots)?;
        // A tree's rows stay until a path is kept (the sliding window's trim counts on
        // rolling back at most a chain's block).
        let blocks: Vec<(usize, bool)> = rows
            .iter()
            .map(|r| (r.tokens.len(), r.parents.is_empty()))
            .collect();
        let mut caches: Vec<&mut SequenceCache> = rows.iter_mut().map(|r| &mut *r.cache).collect();

        let first_shared = self.cfg.num_layers - self.cfg.num_kv_shared_layers;
        let mut per_layer_inputs = per_layer_inputs;
        for (i, layer) in self.layers.iter().enumerate() {
            if i == first_shared && output != OutputRows::All {
                // KV-shared layers write no K/V, so positions nobody reads need not go further.
                if output == OutputRows::None {
                    break;
                }
                let last_rows: Vec<u32> = slots
                    .iter()
                    .map(|s| (s.offset + s.tokens - 1) as u32)
                    .collect();
                let idx = Tensor::new(last_rows.as_slice(), &self.device)?;
                h = h.index_select(&idx, 0)?;
                per_layer_inputs = per_layer_inputs
                    .map(|p| p.index_select(&idx, 0))
                    .transpose()?;
                for (r, s) in slots.iter_mut().enumerate() {
                    for (_, (cos, sin)) in ropes[r].tables.iter_mut() {
                        *cos = cos.narrow(0, s.tokens - 1, 1)?;
                        *sin = sin.narrow(0, s.tokens - 1, 1)?;
                    }
                    *s = RowSlot {
                        offset: r,
                        tokens: 1,
                        position: s.position + s.tokens - 1,
                        tree: None,
                    };
                }
            }
            let pli = per_layer_inputs
                .as_ref()
                .map(|p| p.narrow(1, i, 1).and_then(|x| x.squeeze(1)))
                .transpose()?;
            h = layer.forward(&h, &slots, &ropes, &mut caches, pli.as_ref(), exact)?;
        }
        for (cache, &(tokens, trim)) in caches.iter_mut().zip(&blocks) {
            cache.advance(tokens, trim)?;
        }
        if output == OutputRows::None {
            return Ok(Vec::new());
        }
        let h = self.final_norm.forward(&h)?;
        if output == OutputRows::Last && first_shared == self.cfg.num_layers {
            // No KV-shared layers: the rows were never reduced to the last position.
            return slots
                .iter()
                .map(|s| Ok(h.narrow(0, s.offset + s.tokens - 1, 1)?))
                .collect();
        }
        slots
            .iter()
            .map(|s| Ok(h.narrow(0, s.offset, s.tokens)?))
            .collect()
    }

    /// Logits `[n, vocab]` of final-normed hidden states `[n, hidden]`, softcapped as the
    /// checkpoint asks. Cost is one vocabulary-wide projection per row, so a verifier calls it
    /// only for the positions it needs.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let exact = exact_eligible(&self.device, self.dtype, hidden.dims()[0]);
        let logits = self.lm_head.forward(hidden, exact)?;
        match self.cfg.final_logit_softcapping {
            Some(cap) => softcap(logits, cap),
            None => Ok(logits),
        }
    }

    /// The greedy token of each final-normed hidden state `[n, hidden]`: the lowest id among
    /// the largest softcapped logits, as an argmax over [`Self::logits`] picks it. A packed
    /// head finds each row's best two outputs without storing its logits; a row's logits are
    /// computed only where the softcap rounds those two to one value.
    pub fn greedy_tokens(&self, hidden: &Tensor) -> Result<Vec<u32>> {
        let Some(tops) = self.lm_head.best_two(hidden, self.cfg.vocab_size)? else {
            return self.greedy_from_logits(hidden);
        };
        let cap = self.cfg.final_logit_softcapping;
        tops.iter()
            .enumerate()
            .map(|(r, top)| match decided_after_softcap(*top, cap) {
                Some(token) => Ok(token),
                None => Ok(self.greedy_from_logits(&hidden.narrow(0, r, 1)?)?[0]),
            })
            .collect()
    }

    fn greedy_from_logits(&self, hidden: &Tensor) -> Result<Vec<u32>> {
        let logits = self
            .logits(hidden)?
            .to_dtype(DType::F32)?
            .to_vec2::<f32>()?;
        Ok(logits.iter().map(|row| greedy_token(row)).collect())
    }

    /// The K/V a drafter reads, for positions `from .. to` of a sequence (a whole snapshot or
    /// the rows one round committed). Sliding rows must still be held.
    pub fn shared_kv(&self, cache: &SequenceCache, from: usize, to: usize) -> Result<SharedKv> {
        let full_layer = self
            .cfg
            .last_kv_producer(LayerKind::Full)
            .ok_or_else(|| ModelError::Invalid("the model has no full-attention layer".into()))?;
        let full = cache
            .layer(full_layer)
            .ok_or_else(|| ModelError::Invalid("the sequence is empty".into()))?
            .range(from, to)?;
        let sliding = match self.cfg.last_kv_producer(LayerKind::Sliding) {
            Some(i) => {
                let kv = cache
                    .layer(i)
                    .ok_or_else(|| ModelError::Invalid("the sequence is empty".into()))?;
                Some(kv.range(from.max(kv.start), to)?)
            }
            None => None,
        };
        Ok(SharedKv { full, sliding })
    }

    fn embed_scale_in_dtype(&self) -> f64 {
        // transformers multiplies by the scale cast to the weight dtype (sqrt(3072) becomes 55.5
        // in bf16); match it.
        match self.dtype {
            DType::BF16 => half::bf16::from_f64(self.embed_scale).to_f64(),
            DType::F16 => half::f16::from_f64(self.embed_scale).to_f64(),
            _ => self.embed_scale as f32 as f64,
        }
    }

    /// Per-layer inputs `[n, layers, ple]`, combining the token-identity table with the
    /// projection of the main embedding.
    fn per_layer_inputs(
        &self,
        ids: &Tensor,
        embeds: &Tensor,
        exact: bool,
    ) -> Result<Option<Tensor>> {
        let Some(ple) = &self.per_layer else {
            return Ok(None);
        };
        let n = embeds.dims()[0];
        let layers = self.cfg.num_layers;
        let max_id = ids.max(0)?.to_scalar::<u32>()? as usize;
        if max_id >= self.cfg.per_layer_vocab_size {
            return Err(ModelError::Invalid(format!(
                "token id {max_id} is not below the per-layer vocabulary size {}",
                self.cfg.per_layer_vocab_size
            )));
        }
        let token_part = (ple.table.lookup(ids)? * (ple.width as f64).sqrt())?
            .reshape((n, layers, ple.width))?;
        let projected = (ple.model_projection.forward(embeds, exact)?
            * (self.cfg.hidden_size as f64).powf(-0.5))?
        .reshape((n, layers, ple.width))?;
        let projected = ple.projection_norm.forward(&projected)?;
        Ok(Some(((projected + token_part)? * 2f64.powf(-0.5))?))
    }

    fn row_ropes(&self, slots: &[RowSlot]) -> Result<Vec<RowRope>> {
        slots
            .iter()
            .map(|s| {
                let positions = s.positions();
                let tables = self
                    .ropes
                    .iter()
                    .map(|(key, rope)| {
                        Ok((*key, rope.tensors(&positions, self.dtype, &self.device)?))
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(RowRope { tables })
            })
            .collect()
    }
}

impl CausalLm for Gemma4Model {
    type Cache = SequenceCache;

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn max_context(&self) -> usize {
        self.cfg.max_position_embeddings
    }

    fn device(&self) -> &Device {
        Gemma4Model::device(self)
    }

    fn default_prefill_chunk(&self) -> usize {
        DEFAULT_PREFILL_CHUNK
    }

    fn new_cache(&self, max_rollback: usize) -> Result<SequenceCache> {
        Ok(Gemma4Model::new_cache(self, max_rollback))
    }

    fn cache_len(&self, cache: &SequenceCache) -> usize {
        cache.len()
    }

    fn cache_bytes(&self, cache: &SequenceCache) -> usize {
        cache.kv_bytes()
    }

    fn kv_bytes_bound(&self, tokens: usize, chunk: usize, max_rollback: usize) -> usize {
        let elem = self.dtype.size_in_bytes();
        // A sliding layer keeps the window plus the rollback slack, and briefly one more
        // forward's rows before trimming.
        let sliding_rows = self.cfg.sliding_window + max_rollback + chunk;
        self.cfg
            .layers
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

    fn forward(
        &self,
        rows: &mut [SeqBlock<'_, SequenceCache>],
        output: OutputRows,
    ) -> Result<Vec<Tensor>> {
        Gemma4Model::forward(self, rows, output)
    }

    fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Gemma4Model::logits(self, hidden)
    }

    fn argmax(&self, hidden: &Tensor) -> Result<Vec<u32>> {
        self.greedy_tokens(hidden)
    }

    fn truncate(&self, cache: &mut SequenceCache, len: usize) -> Result<()> {
        cache.truncate(len)
    }

    fn supports_trees(&self) -> bool {
        true
    }

    fn keep_path(&self, cache: &mut SequenceCache, start: usize, path: &[usize]) -> Result<()> {
        cache.keep_path(start, path)
    }

    fn prefix_reuse(&self) -> PrefixReuse {
        // Prefill chunks above the exact kernels' row limit run on GEMM, and attention on
        // candle, whose bits depend on the rows computed together.
        PrefixReuse::PrefillChunks
    }

    fn cache_prefix(
        &self,
        source: &SequenceCache,
        len: usize,
        max_rollback: usize,
    ) -> Result<Option<SequenceCache>> {
        if source.max_rollback() != max_rollback {
            return Ok(None);
        }
        source.prefix(len)
    }

    fn shared_kv(&self, cache: &SequenceCache, from: usize, to: usize) -> Result<Option<SharedKv>> {
        Ok(Some(Gemma4Model::shared_kv(self, cache, from, to)?))
    }
}

/// The tree row `r`'s tokens are the last nodes of, checked against its cache; `None` for
/// a chain.
fn tree_of(r: usize, row: &BlockInput<'_>, output: OutputRows) -> Result<Option<TreeQueries>> {
    if row.parents.is_empty() {
        return Ok(None);
    }
    let (tokens, cached) = (row.tokens.len(), row.cache.len());
    crate::tree::check_block(row.parents, tokens, cached)
        .map_err(|e| ModelError::Invalid(format!("rows[{r}].parents: {e}")))?;
    if output != OutputRows::All {
        return Err(ModelError::Invalid(format!(
            "rows[{r}].parents: a tree block returns the hidden state of every node"
        )));
    }
    Ok(Some(TreeQueries::new(row.parents, tokens, cached)))
}

/// `cap * tanh(logits / cap)`, as transformers applies Gemma 4's final softcap. f32 logits on
/// the CPU are capped in place over the compute pool in one pass: a verify block of 8 rows
/// holds 2M values with Gemma 4's 262,144-token vocabulary.
fn softcap(logits: Tensor, cap: f64) -> Result<Tensor> {
    if !logits.device().is_cpu() || logits.dtype() != DType::F32 {
        return Ok(((logits / cap)?.tanh()? * cap)?);
    }
    let shape = logits.shape().clone();
    let mut values = logits.flatten_all()?.to_vec1::<f32>()?;
    const CHUNK: usize = 1 << 14;
    let inline = values.len() <= CHUNK;
    ThreadPool::global().for_each_chunk_mut(&mut values, CHUNK, inline, |_, chunk| {
        for v in chunk {
            *v = softcapped(*v, cap);
        }
    });
    Ok(Tensor::from_vec(values, shape, logits.device())?)
}

/// One f32 logit through the softcap, as [`softcap`] computes it on the CPU.
fn softcapped(logit: f32, cap: f64) -> f32 {
    let cap = cap as f32;
    (logit / cap).tanh() * cap
}

/// The greedy token of a row from its two largest raw logits, when the softcap leaves the
/// largest strictly above the runner-up (the softcap never reorders, but may round two
/// logits to one value, and the argmax then takes the lower id); `None` when it cannot tell.
fn decided_after_softcap([best, runner_up]: BestTwo, cap: Option<f64>) -> Option<u32> {
    if best.0 == u32::MAX || best.1.is_nan() {
        return None;
    }
    match cap {
        _ if runner_up.0 == u32::MAX => Some(best.0),
        None => Some(best.0),
        Some(cap) => (softcapped(best.1, cap) > softcapped(runner_up.1, cap)).then_some(best.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_softcap_decides_a_row_only_where_it_keeps_the_two_apart() {
        let none = (u32::MAX, f32::NAN);
        assert_eq!(
            decided_after_softcap([(7, 2.0), (3, 1.0)], Some(30.0)),
            Some(7)
        );
        assert_eq!(decided_after_softcap([(7, 2.0), (3, 1.0)], None), Some(7));
        assert_eq!(decided_after_softcap([(7, 2.0), none], Some(30.0)), Some(7));
        assert_eq!(decided_after_softcap([none, none], Some(30.0)), None);
        // Far out on the curve two raw logits a few ulps apart round to the same value, and
        // an argmax over the softcapped logits would pick the lower id: undecided here.
        let (hi, lo) = (500.0f32, 499.99997f32);
        assert!(hi > lo);
        assert_eq!(softcapped(hi, 30.0), softcapped(lo, 30.0));
        assert_eq!(decided_after_softcap([(9, hi), (2, lo)], Some(30.0)), None);
    }
}
