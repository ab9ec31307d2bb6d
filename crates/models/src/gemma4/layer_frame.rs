//! What every Gemma 4 decoder layer has around its attention, the target's and the
//! assistant's alike: the four sandwich norms, the GeGLU MLP's projections and the layer
//! scalar, loaded in one place.

use candle_core::Tensor;

use super::norm::RmsNorm;
use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::projection::Projection;

pub(crate) struct LayerFrame {
    pub(crate) gate_proj: Projection,
    pub(crate) up_proj: Projection,
    pub(crate) down_proj: Projection,
    pub(crate) input_norm: RmsNorm,
    pub(crate) post_attention_norm: RmsNorm,
    pub(crate) pre_feedforward_norm: RmsNorm,
    pub(crate) post_feedforward_norm: RmsNorm,
    pub(crate) layer_scalar: Tensor,
}

impl LayerFrame {
    /// The frame of the layer whose tensors are named `{p}.…`: `hidden` wide, its MLP
    /// `intermediate` wide. A checkpoint without `layer_scalar` scales by one.
    pub(crate) fn load(
        ckpt: &Checkpoint,
        p: &str,
        hidden: usize,
        intermediate: usize,
        eps: f64,
    ) -> Result<Self> {
        let h = hidden;
        let scalar_name = format!("{p}.layer_scalar");
        let layer_scalar = if ckpt.contains(&scalar_name) {
            ckpt.tensor(&scalar_name, &[1])?
        } else {
            Tensor::ones(1, ckpt.dtype(), ckpt.device())?
        };
        let mlp = |name: &str, out: usize, inp: usize| {
            Projection::load(ckpt, &format!("{p}.mlp.{name}"), out, inp, false)
        };
        Ok(Self {
            gate_proj: mlp("gate_proj", intermediate, h)?,
            up_proj: mlp("up_proj", intermediate, h)?,
            down_proj: mlp("down_proj", h, intermediate)?,
            input_norm: norm(ckpt, &format!("{p}.input_layernorm"), h, eps)?,
            post_attention_norm: norm(ckpt, &format!("{p}.post_attention_layernorm"), h, eps)?,
            pre_feedforward_norm: norm(ckpt, &format!("{p}.pre_feedforward_layernorm"), h, eps)?,
            post_feedforward_norm: norm(ckpt, &format!("{p}.post_feedforward_layernorm"), h, eps)?,
            layer_scalar,
        })
    }

    /// The GeGLU MLP of `h` (before its pre-feed-forward norm): `down(gelu(gate(x)) *
    /// up(x))`, gate and up in one pass over the normed input.
    pub(crate) fn mlp(&self, h: &Tensor, exact: bool) -> Result<Tensor> {
        let x = self.pre_feedforward_norm.forward(h)?;
        let [gate, up]: [Tensor; 2] =
            Projection::forward_all(&[&self.gate_proj, &self.up_proj], &x, exact)?
                .try_into()
                .map_err(|_| candle_core::Error::Msg("gate and up: two outputs expected".into()))?;
        self.down_proj.forward(&(gate.gelu()? * up)?, exact)
    }
}

/// The RMSNorm whose weight is `{name}.weight`, `dim` wide.
pub(crate) fn norm(ckpt: &Checkpoint, name: &str, dim: usize, eps: f64) -> Result<RmsNorm> {
    Ok(RmsNorm::new(
        ckpt.tensor(&format!("{name}.weight"), &[dim])?,
        eps,
    ))
}
