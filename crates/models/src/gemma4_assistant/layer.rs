//! One assistant decoder layer: a Gemma 4 layer whose attention has only a query projection
//! and reads the target's K/V of its layer kind.

use candle_core::Tensor;

use crate::blocks::attention::attend;
use crate::blocks::rope::rotate;
use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::exact::AttentionSpan;
use crate::gemma4::layer_frame::{norm, LayerFrame};
use crate::gemma4::norm::RmsNorm;
use crate::gemma4::{Gemma4TextConfig, LayerGeometry, LayerKind};
use crate::projection::Projection;

/// The target K/V rows one layer's query attends to: every row it may see and no other,
/// `[kv_heads, rows, head_dim]`, the last row being the query's own position.
pub struct VisibleKv {
    pub keys: Tensor,
    pub values: Tensor,
    /// Position of the first visible row.
    pub start: usize,
}

pub struct AssistantLayer {
    geometry: LayerGeometry,
    num_heads: usize,
    q_proj: Projection,
    q_norm: RmsNorm,
    o_proj: Projection,
    frame: LayerFrame,
}

impl AssistantLayer {
    pub fn load(ckpt: &Checkpoint, cfg: &Gemma4TextConfig, index: usize) -> Result<Self> {
        let g = cfg.layers[index].clone();
        let p = format!("model.layers.{index}");
        let (h, eps, bias) = (cfg.hidden_size, cfg.rms_norm_eps, cfg.attention_bias);
        let q_width = cfg.num_heads * g.head_dim;
        Ok(Self {
            num_heads: cfg.num_heads,
            q_proj: Projection::load(ckpt, &format!("{p}.self_attn.q_proj"), q_width, h, bias)?,
            q_norm: norm(ckpt, &format!("{p}.self_attn.q_norm"), g.head_dim, eps)?,
            o_proj: Projection::load(ckpt, &format!("{p}.self_attn.o_proj"), h, q_width, bias)?,
            frame: LayerFrame::load(ckpt, &p, h, cfg.intermediate_size, eps)?,
            geometry: g,
        })
    }

    pub fn kind(&self) -> LayerKind {
        self.geometry.kind
    }

    pub fn geometry(&self) -> &LayerGeometry {
        &self.geometry
    }

    /// Runs the layer on one row `x [1, hidden]` whose query sits at `position`, with the RoPE
    /// table `(cos, sin)` of that position for this layer's head dim.
    pub fn forward(
        &self,
        x: &Tensor,
        rope_table: &(Tensor, Tensor),
        kv: &VisibleKv,
        exact: bool,
    ) -> Result<Tensor> {
        let attn = self.attention(&self.frame.input_norm.forward(x)?, rope_table, kv, exact)?;
        let x = (x + self.frame.post_attention_norm.forward(&attn)?)?;

        let mlp = self.frame.mlp(&x, exact)?;
        let x = (x + self.frame.post_feedforward_norm.forward(&mlp)?)?;
        Ok(x.broadcast_mul(&self.frame.layer_scalar)?)
    }

    fn attention(
        &self,
        x: &Tensor,
        (cos, sin): &(Tensor, Tensor),
        kv: &VisibleKv,
        exact: bool,
    ) -> Result<Tensor> {
        let (hq, d) = (self.num_heads, self.geometry.head_dim);
        let q = self.q_proj.forward(x, exact)?.reshape((1, hq, d))?;
        let q = rotate(&self.q_norm.forward(&q)?, cos, sin)?;
        let rows = kv.keys.dims()[1];
        // The query sits at the last visible position, so a causal span over exactly the
        // visible rows admits them all.
        let span = AttentionSpan {
            query_start: kv.start + rows - 1,
            key_start: kv.start,
            window: None,
            scale: 1.0,
            tree: None,
        };
        let out = attend(&q, &kv.keys, &kv.values, span, exact)?;
        self.o_proj.forward(&out.reshape((1, hq * d))?, exact)
    }
}
