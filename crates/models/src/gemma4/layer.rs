//! One Gemma 4 decoder layer: attention with q/k/v norms, GeGLU MLP with the four sandwich
//! norms (and, in a mixture-of-experts model, the experts beside it), the per-layer-embedding
//! residual, and the layer scalar.

use candle_core::Tensor;

use super::cache::SequenceCache;
use super::config::{Gemma4TextConfig, LayerGeometry, LayerKind};
use super::layer_frame::{norm, LayerFrame};
use super::moe::MoeBlock;
use super::norm::RmsNorm;
use crate::blocks::attention::attend;
use crate::blocks::rope::rotate;
use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::exact::{AttentionSpan, TreeQueries};
use crate::projection::Projection;

/// Where one sequence's tokens sit in a packed forward.
#[derive(Debug, Clone)]
pub struct RowSlot {
    /// First packed row of this sequence.
    pub offset: usize,
    pub tokens: usize,
    /// Cache slot of the first token: its position too, unless the tokens are tree nodes.
    pub position: usize,
    /// The tree the tokens are the last nodes of; `None`: a chain.
    pub tree: Option<TreeQueries>,
}

impl RowSlot {
    /// The position of each token.
    pub fn positions(&self) -> Vec<usize> {
        (0..self.tokens)
            .map(|t| match &self.tree {
                Some(tree) => tree.position(t),
                None => self.position + t,
            })
            .collect()
    }
}

/// RoPE tables of one sequence for each layer's (kind, head_dim).
pub struct RowRope {
    pub tables: Vec<((LayerKind, usize), (Tensor, Tensor))>,
}

impl RowRope {
    fn get(&self, key: (LayerKind, usize)) -> Option<&(Tensor, Tensor)> {
        self.tables.iter().find(|(k, _)| *k == key).map(|(_, t)| t)
    }
}

struct Attention {
    q_proj: Projection,
    k_proj: Option<Projection>,
    v_proj: Option<Projection>,
    o_proj: Projection,
    q_norm: RmsNorm,
    k_norm: Option<RmsNorm>,
    v_norm: RmsNorm,
}

struct PerLayerInput {
    gate: Projection,
    projection: Projection,
    post_norm: RmsNorm,
}

pub struct DecoderLayer {
    index: usize,
    geometry: LayerGeometry,
    num_heads: usize,
    window: Option<usize>,
    attn: Attention,
    frame: LayerFrame,
    per_layer_input: Option<PerLayerInput>,
    moe: Option<MoeBlock>,
}

impl DecoderLayer {
    pub fn load(
        ckpt: &Checkpoint,
        cfg: &Gemma4TextConfig,
        index: usize,
        prefix: &str,
    ) -> Result<Self> {
        let g = cfg.layers[index].clone();
        let p = format!("{prefix}layers.{index}");
        let h = cfg.hidden_size;
        let eps = cfg.rms_norm_eps;
        let bias = cfg.attention_bias;
        let owns_kv = g.kv_source == index;
        let kv_width = g.num_kv_heads * g.head_dim;
        let attn = Attention {
            q_proj: Projection::load(
                ckpt,
                &format!("{p}.self_attn.q_proj"),
                cfg.num_heads * g.head_dim,
                h,
                bias,
            )?,
            k_proj: owns_kv
                .then(|| {
                    Projection::load(ckpt, &format!("{p}.self_attn.k_proj"), kv_width, h, bias)
                })
                .transpose()?,
            v_proj: (owns_kv && !g.k_eq_v)
                .then(|| {
                    Projection::load(ckpt, &format!("{p}.self_attn.v_proj"), kv_width, h, bias)
                })
                .transpose()?,
            o_proj: Projection::load(
                ckpt,
                &format!("{p}.self_attn.o_proj"),
                h,
                cfg.num_heads * g.head_dim,
                bias,
            )?,
            q_norm: norm(ckpt, &format!("{p}.self_attn.q_norm"), g.head_dim, eps)?,
            k_norm: owns_kv
                .then(|| norm(ckpt, &format!("{p}.self_attn.k_norm"), g.head_dim, eps))
                .transpose()?,
            v_norm: RmsNorm::unscaled(eps),
        };
        let per_layer_input = match cfg.per_layer_input_size {
            Some(ple) => Some(PerLayerInput {
                gate: Projection::load(ckpt, &format!("{p}.per_layer_input_gate"), ple, h, false)?,
                projection: Projection::load(
                    ckpt,
                    &format!("{p}.per_layer_projection"),
                    h,
                    ple,
                    false,
                )?,
                post_norm: norm(ckpt, &format!("{p}.post_per_layer_input_norm"), h, eps)?,
            }),
            None => None,
        };
        Ok(Self {
            index,
            window: (g.kind == LayerKind::Sliding).then_some(cfg.sliding_window),
            num_heads: cfg.num_heads,
            attn,
            frame: LayerFrame::load(ckpt, &p, h, g.mlp_intermediate, eps)?,
            per_layer_input,
            moe: cfg
                .moe
                .map(|moe| MoeBlock::load(ckpt, &p, moe, h, eps))
                .transpose()?,
            geometry: g,
        })
    }

    #[allow(dead_code)]
    pub fn geometry(&self) -> &LayerGeometry {
        &self.geometry
    }

    /// Runs the layer over packed rows `h [n, hidden]`; `per_layer_input` is `[n, ple]`.
    pub fn forward(
        &self,
        h: &Tensor,
        rows: &[RowSlot],
        ropes: &[RowRope],
        caches: &mut [&mut SequenceCache],
        per_layer_input: Option<&Tensor>,
        exact: bool,
    ) -> Result<Tensor> {
        let attn_out = self.attention(
            &self.frame.input_norm.forward(h)?,
            rows,
            ropes,
            caches,
            exact,
        )?;
        let h = (h + self.frame.post_attention_norm.forward(&attn_out)?)?;

        let mlp = self.frame.mlp(&h, exact)?;
        let feed_forward = match &self.moe {
            Some(moe) => moe.forward(&h, &mlp, exact)?,
            None => mlp,
        };
        let mut h = (h + self.frame.post_feedforward_norm.forward(&feed_forward)?)?;

        if let (Some(ple), Some(input)) = (&self.per_layer_input, per_layer_input) {
            let g = ple.gate.forward(&h, exact)?.gelu()?;
            let g = ple.projection.forward(&(g * input)?, exact)?;
            h = (h + ple.post_norm.forward(&g)?)?;
        }
        Ok(h.broadcast_mul(&self.frame.layer_scalar)?)
    }

    fn attention(
        &self,
        x: &Tensor,
        rows: &[RowSlot],
        ropes: &[RowRope],
        caches: &mut [&mut SequenceCache],
        exact: bool,
    ) -> Result<Tensor> {
        let g = &self.geometry;
        let (hq, hkv, d) = (self.num_heads, g.num_kv_heads, g.head_dim);
        let n = x.dims()[0];
        // q, k and v (those the layer has) in one pass over the input.
        let mut projections = vec![&self.attn.q_proj];
        projections.extend(&self.attn.k_proj);
        if self.attn.k_proj.is_some() {
            projections.extend(&self.attn.v_proj);
        }
        let mut outputs = Projection::forward_all(&projections, x, exact)?.into_iter();
        let mut next = || {
            outputs
                .next()
                .ok_or_else(|| candle_core::Error::Msg("a projection gave no output".into()))
        };
        let q_all = next()?.reshape((n, hq, d))?;
        let q_all = self.attn.q_norm.forward(&q_all)?;
        let kv_all = match &self.attn.k_proj {
            Some(_) => {
                let raw_k = next()?.reshape((n, hkv, d))?;
                let raw_v = match &self.attn.v_proj {
                    Some(_) => next()?.reshape((n, hkv, d))?,
                    None => raw_k.clone(),
                };
                let k = self
                    .attn
                    .k_norm
                    .as_ref()
                    .map(|nrm| nrm.forward(&raw_k))
                    .transpose()?
                    .unwrap_or(raw_k);
                Some((k, self.attn.v_norm.forward(&raw_v)?))
            }
            None => None,
        };

        let key = (g.kind, d);
        let mut outputs = Vec::with_capacity(rows.len());
        for (r, row) in rows.iter().enumerate() {
            let (cos, sin) = ropes[r].get(key).ok_or_else(|| {
                candle_core::Error::Msg(format!("no rope table for layer {}", self.index))
            })?;
            let q = rotate(&q_all.narrow(0, row.offset, row.tokens)?, cos, sin)?;
            if let Some((k_all, v_all)) = &kv_all {
                let k = rotate(&k_all.narrow(0, row.offset, row.tokens)?, cos, sin)?;
                let v = v_all.narrow(0, row.offset, row.tokens)?;
                caches[r].append(
                    self.index,
                    k.transpose(0, 1)?.contiguous()?,
                    v.transpose(0, 1)?.contiguous()?,
                )?;
            }
            let kv = caches[r].layer(g.kv_source).ok_or_else(|| {
                candle_core::Error::Msg(format!(
                    "layer {} reads K/V of layer {} before it exists",
                    self.index, g.kv_source
                ))
            })?;
            let span = AttentionSpan {
                query_start: row.position,
                key_start: kv.start,
                window: self.window,
                scale: 1.0,
                tree: row.tree.as_ref(),
            };
            let out = attend(&q, &kv.keys, &kv.values, span, exact)?;
            outputs.push(out.reshape((row.tokens, hq * d))?);
        }
        let out = Tensor::cat(&outputs, 0)?;
        self.attn.o_proj.forward(&out, exact)
    }
}
