//! The Gemma 4 assistant drafter (`Gemma4AssistantForCausalLM`) and its draft block.

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::config::Gemma4AssistantConfig;
use super::embedding::TargetEmbedding;
use super::head::{CentroidSelection, Head};
use super::layer::{AssistantLayer, VisibleKv};
use super::mirror::SharedKvMirror;
use crate::blocks::rope::RotaryTable;
use crate::causal_lm::TopTwo;
use crate::checkpoint::Checkpoint;
use crate::error::{ModelError, Result};
use crate::gemma4::norm::RmsNorm;
use crate::gemma4::rope::tables_by_layer;
use crate::gemma4::{Gemma4TextConfig, LayerKind, SharedKv};
use crate::linear::exact_eligible;
use crate::projection::Projection;

/// What one drafter step produces.
#[derive(Debug, Clone)]
pub struct DraftStep {
    /// The assistant's final-normed hidden `[1, H_d]`: the input of its LM head.
    pub normed: Tensor,
    /// `post_projection(normed)` `[1, H_t]`: the hidden the next step consumes.
    pub hidden: Tensor,
}

/// Everything a draft block reads that stays fixed across its steps: the query position's
/// RoPE tables and the visible K/V of each layer kind.
struct BlockContext {
    ropes: Vec<((LayerKind, usize), (Tensor, Tensor))>,
    full: VisibleKv,
    sliding: Option<VisibleKv>,
}

impl BlockContext {
    fn rope(&self, key: (LayerKind, usize)) -> Result<&(Tensor, Tensor)> {
        self.ropes
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, t)| t)
            .ok_or_else(|| {
                ModelError::Invalid(format!(
                    "no RoPE table for {} layers of head dim {}",
                    key.0.as_str(),
                    key.1
                ))
            })
    }

    fn kv(&self, kind: LayerKind) -> Result<&VisibleKv> {
        match kind {
            LayerKind::Full => Ok(&self.full),
            LayerKind::Sliding => self
                .sliding
                .as_ref()
                .ok_or_else(|| ModelError::Invalid("the shared K/V has no sliding rows".into())),
        }
    }
}

/// A draft block's fixed inputs ([`Gemma4Assistant::block_steps`]), computed once for all
/// its steps.
pub struct BlockSteps<'a> {
    model: &'a Gemma4Assistant,
    ctx: BlockContext,
    exact: bool,
}

impl BlockSteps<'_> {
    /// [`Gemma4Assistant::step`] in this block: `token` after the step that gave `hidden`
    /// (the target's hidden for the bonus).
    pub fn step(&self, token: u32, hidden: &Tensor) -> Result<DraftStep> {
        self.model.check_token(token, "token")?;
        self.run(token, &self.model.prepare_hidden(hidden)?)
    }

    /// A step from a hidden state already in the drafter's dtype and device.
    fn run(&self, token: u32, hidden: &Tensor) -> Result<DraftStep> {
        self.model.step_in(&self.ctx, token, hidden, self.exact)
    }
}

pub struct Gemma4Assistant {
    cfg: Gemma4AssistantConfig,
    target_embedding: TargetEmbedding,
    pre_projection: Projection,
    post_projection: Projection,
    layers: Vec<AssistantLayer>,
    ropes: Vec<((LayerKind, usize), RotaryTable)>,
    final_norm: RmsNorm,
    head: Head,
    device: Device,
    dtype: DType,
}

impl Gemma4Assistant {
    /// Loads the assistant at `drafter` and the token embedding of its target at `target`
    /// (only that table, memory-mapped). Each is a checkpoint directory or a GGUF file in
    /// llama.cpp's converter layout (`gemma4-assistant`, `gemma4`). Refuses a target the
    /// assistant does not fit.
    pub fn load(drafter: &Path, target: &Path, dtype: DType, device: &Device) -> Result<Self> {
        let (cfg, ckpt) = if drafter.is_file() {
            let (config, ckpt) = crate::gemma4::gguf::open_assistant(drafter, dtype, device)?;
            (Gemma4AssistantConfig::from_json(&config)?, ckpt)
        } else {
            let cfg = Gemma4AssistantConfig::from_dir(drafter)?;
            (cfg, Checkpoint::open(drafter, dtype, device)?)
        };
        let (target_cfg, layout) = if target.is_file() {
            // Only the configuration is kept; the table is read by TargetEmbedding.
            let (cfg, layout, _) = crate::gemma4::gguf::open(target, dtype, device)?;
            (cfg, layout)
        } else {
            Gemma4TextConfig::from_dir(target)?
        };
        cfg.check_target(&target_cfg)?;
        let target_embedding = TargetEmbedding::open(target, &target_cfg, &layout, dtype, device)?;
        let model = Self::from_parts(cfg, target_embedding, &ckpt)?;
        tracing::debug!(
            layers = model.layers.len(),
            hidden = model.cfg.hidden_size(),
            backbone = model.cfg.backbone_hidden_size,
            centroid_head = model.cfg.use_ordered_embeddings,
            "loaded the Gemma 4 assistant"
        );
        Ok(model)
    }

    fn from_parts(
        cfg: Gemma4AssistantConfig,
        target_embedding: TargetEmbedding,
        ckpt: &Checkpoint,
    ) -> Result<Self> {
        let (hd, ht) = (cfg.hidden_size(), cfg.backbone_hidden_size);
        let text = &cfg.text;
        let layers = (0..text.num_layers)
            .map(|i| AssistantLayer::load(ckpt, text, i))
            .collect::<Result<Vec<_>>>()?;
        let ropes = tables_by_layer(text);
        Ok(Self {
            pre_projection: Projection::load(ckpt, "pre_projection", hd, 2 * ht, false)?,
            post_projection: Projection::load(ckpt, "post_projection", ht, hd, false)?,
            final_norm: RmsNorm::new(ckpt.tensor("model.norm.weight", &[hd])?, text.rms_norm_eps),
            head: Head::load(ckpt, &cfg)?,
            layers,
            ropes,
            target_embedding,
            device: ckpt.device().clone(),
            dtype: ckpt.dtype(),
            cfg,
        })
    }

    pub fn config(&self) -> &Gemma4AssistantConfig {
        &self.cfg
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn vocab_size(&self) -> usize {
        self.cfg.text.vocab_size
    }

    /// A session mirror built from a snapshot of the target's shared K/V, keeping the sliding
    /// rows this assistant's queries can see.
    pub fn new_mirror(&self, snapshot: &SharedKv) -> Result<SharedKvMirror> {
        SharedKvMirror::from_snapshot(
            snapshot,
            self.cfg.sliding_keys_visible(),
            self.dtype,
            &self.device,
        )
    }

    fn exact(&self) -> bool {
        exact_eligible(&self.device, self.dtype, 1)
    }

    /// The fixed inputs of a block drafted after `mirror.committed_len()` committed tokens.
    fn block_context(&self, mirror: &SharedKvMirror) -> Result<BlockContext> {
        let len = mirror.committed_len();
        let position = len - 1;
        let ropes = self
            .ropes
            .iter()
            .map(|(key, rope)| Ok((*key, rope.tensors(&[position], self.dtype, &self.device)?)))
            .collect::<Result<Vec<_>>>()?;

        let full = mirror.full()?;
        self.check_geometry(LayerKind::Full, full.keys.dims())?;
        let full = VisibleKv {
            keys: full.keys.contiguous()?,
            values: full.values.contiguous()?,
            start: full.start,
        };

        let sliding = match mirror.sliding()? {
            Some(rows) => {
                self.check_geometry(LayerKind::Sliding, rows.keys.dims())?;
                // transformers' assistant mask: the last committed position and the W before it.
                let first = len.saturating_sub(self.cfg.sliding_keys_visible());
                if rows.start > first {
                    return Err(ModelError::Invalid(format!(
                        "shared K/V: sliding rows start at position {} but the query at {position} sees keys from {first}",
                        rows.start
                    )));
                }
                let (skip, n) = (first - rows.start, len - first);
                Some(VisibleKv {
                    keys: rows.keys.narrow(1, skip, n)?.contiguous()?,
                    values: rows.values.narrow(1, skip, n)?.contiguous()?,
                    start: first,
                })
            }
            None if self.layers.iter().any(|l| l.kind() == LayerKind::Sliding) => {
                return Err(ModelError::Invalid(
                    "shared K/V: the drafter has sliding layers but no sliding rows were given"
                        .into(),
                ))
            }
            None => None,
        };
        Ok(BlockContext {
            ropes,
            full,
            sliding,
        })
    }

    fn check_geometry(&self, kind: LayerKind, dims: &[usize]) -> Result<()> {
        let Some(layer) = self.layers.iter().find(|l| l.kind() == kind) else {
            return Ok(());
        };
        let g = layer.geometry();
        if dims.len() != 3 || dims[0] != g.num_kv_heads || dims[2] != g.head_dim {
            return Err(ModelError::Invalid(format!(
                "shared K/V: {} rows are {dims:?}, but the drafter's {} layers read {} heads x {} dims",
                kind.as_str(),
                kind.as_str(),
                g.num_kv_heads,
                g.head_dim
            )));
        }
        Ok(())
    }

    /// `hidden` as `[1, H_t]` in the drafter's dtype and device.
    fn prepare_hidden(&self, hidden: &Tensor) -> Result<Tensor> {
        let ht = self.cfg.backbone_hidden_size;
        if hidden.elem_count() != ht || hidden.rank() > 2 {
            return Err(ModelError::Invalid(format!(
                "hidden: expected [1, {ht}], got {:?}",
                hidden.dims()
            )));
        }
        Ok(hidden
            .reshape((1, ht))?
            .to_dtype(self.dtype)?
            .to_device(&self.device)?)
    }

    fn check_token(&self, token: u32, what: &str) -> Result<()> {
        if token as usize >= self.vocab_size() {
            return Err(ModelError::Invalid(format!(
                "{what}: token id {token} is not below the vocabulary size {}",
                self.vocab_size()
            )));
        }
        Ok(())
    }

    fn step_in(
        &self,
        ctx: &BlockContext,
        token: u32,
        hidden: &Tensor,
        exact: bool,
    ) -> Result<DraftStep> {
        let embedded = self.target_embedding.embed(token)?;
        let mut x = self
            .pre_projection
            .forward(&Tensor::cat(&[&embedded, hidden], 1)?, exact)?;
        for layer in &self.layers {
            let g = layer.geometry();
            x = layer.forward(&x, ctx.rope((g.kind, g.head_dim))?, ctx.kv(g.kind)?, exact)?;
        }
        let normed = self.final_norm.forward(&x)?;
        let hidden = self.post_projection.forward(&normed, exact)?;
        Ok(DraftStep { normed, hidden })
    }

    /// One drafter step: embeds `token`, pairs it with `hidden` (the target's final-normed
    /// hidden of the last committed token for the first step, the previous step's
    /// `DraftStep::hidden` after that) and queries the shared K/V at the last committed position.
    pub fn step(&self, mirror: &SharedKvMirror, token: u32, hidden: &Tensor) -> Result<DraftStep> {
        self.block_steps(mirror)?.step(token, hidden)
    }

    /// Full-vocabulary logits of a step (the centroid head's sparse vector as transformers
    /// builds it). There is no final softcap in the assistant.
    pub fn logits(&self, normed: &Tensor) -> Result<Vec<f32>> {
        self.head.logits(normed, self.vocab_size(), self.exact())
    }

    /// The greedy token of a step; the centroid head scores only its selected clusters.
    pub fn argmax(&self, normed: &Tensor) -> Result<u32> {
        self.head.argmax(normed, self.vocab_size(), self.exact())
    }

    /// [`Self::argmax`] of a step and the runner-up among the tokens the head scores.
    pub fn top_two(&self, normed: &Tensor) -> Result<TopTwo> {
        self.head.top_two(normed, self.vocab_size(), self.exact())
    }

    /// What the centroid head scores for a step; `None` for a dense head.
    pub fn centroid_selection(&self, normed: &Tensor) -> Result<Option<CentroidSelection>> {
        match &self.head {
            Head::Centroid(head) => Ok(Some(head.select(normed, self.exact())?)),
            Head::Dense(_) => Ok(None),
        }
    }

    /// The steps of one draft block after `mirror.committed_len()` committed tokens, to run
    /// one at a time: a tree's nodes, each after its parent.
    pub fn block_steps(&self, mirror: &SharedKvMirror) -> Result<BlockSteps<'_>> {
        Ok(BlockSteps {
            model: self,
            ctx: self.block_context(mirror)?,
            exact: self.exact(),
        })
    }

    /// Drafts `steps` tokens greedily after `bonus`, starting from the target's final-normed
    /// hidden of the last committed token `[1, H_t]`.
    pub fn draft_greedy(
        &self,
        mirror: &SharedKvMirror,
        bonus: u32,
        hidden: &Tensor,
        steps: usize,
    ) -> Result<Vec<u32>> {
        self.draft_with(mirror, bonus, hidden, steps, |normed, _| {
            self.argmax(normed)
        })
    }

    /// Drafts `steps` tokens, each drawn by `sampler(logits, step)` from the full-vocabulary
    /// logits of step `step` (0-based within the block).
    pub fn draft_sampled<F>(
        &self,
        mirror: &SharedKvMirror,
        bonus: u32,
        hidden: &Tensor,
        steps: usize,
        mut sampler: F,
    ) -> Result<Vec<u32>>
    where
        F: FnMut(&[f32], usize) -> u32,
    {
        self.draft_with(mirror, bonus, hidden, steps, |normed, step| {
            let token = sampler(&self.logits(normed)?, step);
            self.check_token(token, &format!("sampler output at step {step}"))?;
            Ok(token)
        })
    }

    fn draft_with<F>(
        &self,
        mirror: &SharedKvMirror,
        bonus: u32,
        hidden: &Tensor,
        steps: usize,
        mut choose: F,
    ) -> Result<Vec<u32>>
    where
        F: FnMut(&Tensor, usize) -> Result<u32>,
    {
        self.check_token(bonus, "bonus")?;
        if steps == 0 {
            return Ok(Vec::new());
        }
        let block = self.block_steps(mirror)?;
        let mut hidden = self.prepare_hidden(hidden)?;
        let mut token = bonus;
        let mut drafts = Vec::with_capacity(steps);
        for step in 0..steps {
            let out = block.run(token, &hidden)?;
            token = choose(&out.normed, step)?;
            hidden = out.hidden;
            drafts.push(token);
        }
        Ok(drafts)
    }
}
