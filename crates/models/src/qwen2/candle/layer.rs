//! One Qwen2 decoder block (pre-norm attention and SwiGLU MLP, both residual) and its loading.

use std::borrow::Cow;

use candle_core::quantized::{QStorage, QTensor};
use candle_core::{Device, Tensor};

use super::super::config::{Qwen2Config, RotaryPairs};
use super::super::error::Result;
use super::super::rotary_rows::halves_from_adjacent;
use super::attend::Rows;
use super::attention::Attention;
use super::cache::DeviceKv;
use super::linear::QLinear;
use crate::cpu::Span;
use crate::exact::TreeQueries;
use crate::gguf::{GgufError, GgufFile};

/// What loading needs besides the file: the device.
pub(crate) struct LoadContext<'a> {
    pub(crate) gguf: &'a mut GgufFile,
    pub(crate) device: &'a Device,
}

impl LoadContext<'_> {
    /// Loads `{name}.weight` `[out, in]` (and `{name}.bias` `[out]` when `bias`).
    pub(crate) fn linear(
        &mut self,
        name: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<QLinear> {
        let weight = self
            .gguf
            .qtensor(&format!("{name}.weight"), &[out, inp], self.device)?;
        let bias = match bias {
            true => Some(
                self.gguf
                    .dense(&format!("{name}.bias"), &[out], self.device)?,
            ),
            false => None,
        };
        QLinear::new(weight, bias)
    }

    /// A Q or K projection (bias where the file has one), its rows in the halves order the
    /// rotary embedding rotates.
    fn rotary_linear(
        &mut self,
        name: &str,
        out: usize,
        inp: usize,
        config: &Qwen2Config,
    ) -> Result<QLinear> {
        let (weight_name, bias_name) = (format!("{name}.weight"), format!("{name}.bias"));
        let has_bias = self.gguf.has_tensor(&bias_name);
        if config.rotary_pairs() == RotaryPairs::Halves {
            return self.linear(name, out, inp, has_bias);
        }
        let head_dim = config.head_dim;
        let raw = self.gguf.raw(&weight_name, &[out, inp])?;
        let row_bytes = raw.bytes.len() / out.max(1);
        let rows = halves_from_adjacent(&weight_name, raw.bytes, head_dim, row_bytes)?;
        let wrap = |source| GgufError::TensorLoad {
            name: weight_name.clone(),
            source,
        };
        let weight = QTensor::new(
            QStorage::from_data(Cow::Owned(rows), self.device, raw.dtype).map_err(wrap)?,
            vec![out, inp],
        )
        .map_err(wrap)?;
        let bias = match has_bias {
            true => {
                let stored = self.gguf.dense(&bias_name, &[out], &Device::Cpu)?;
                let values = stored.to_vec1::<f32>()?;
                let values = halves_from_adjacent(&bias_name, &values, head_dim, 1)?;
                Some(Tensor::from_vec(values, out, self.device)?)
            }
            false => None,
        };
        QLinear::new(weight, bias)
    }

    pub(crate) fn norm(&mut self, name: &str, size: usize) -> Result<Tensor> {
        Ok(self
            .gguf
            .dense(&format!("{name}.weight"), &[size], self.device)?)
    }
}

pub(crate) struct DecoderLayer {
    attn_norm: Tensor,
    attention: Attention,
    ffn_norm: Tensor,
    gate: QLinear,
    up: QLinear,
    down: QLinear,
    eps: f32,
}

impl DecoderLayer {
    pub(crate) fn load(
        ctx: &mut LoadContext<'_>,
        index: usize,
        config: &Qwen2Config,
    ) -> Result<Self> {
        let p = format!("blk.{index}");
        let (hidden, kv_dim, ffn) = (
            config.hidden_size,
            config.kv_dim(),
            config.intermediate_size,
        );
        let attention = Attention {
            q: ctx.rotary_linear(&format!("{p}.attn_q"), hidden, hidden, config)?,
            k: ctx.rotary_linear(&format!("{p}.attn_k"), kv_dim, hidden, config)?,
            v: {
                let has_bias = ctx.gguf.has_tensor(&format!("{p}.attn_v.bias"));
                ctx.linear(&format!("{p}.attn_v"), kv_dim, hidden, has_bias)?
            },
            o: ctx.linear(&format!("{p}.attn_output"), hidden, hidden, false)?,
            heads: config.num_heads,
            kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
        };
        Ok(Self {
            attn_norm: ctx.norm(&format!("{p}.attn_norm"), hidden)?,
            attention,
            ffn_norm: ctx.norm(&format!("{p}.ffn_norm"), hidden)?,
            gate: ctx.linear(&format!("{p}.ffn_gate"), ffn, hidden, false)?,
            up: ctx.linear(&format!("{p}.ffn_up"), ffn, hidden, false)?,
            down: ctx.linear(&format!("{p}.ffn_down"), hidden, ffn, false)?,
            eps: config.rms_norm_eps as f32,
        })
    }

    pub(crate) fn forward(
        &self,
        x: &Tensor,
        cos_sin: &(Tensor, Tensor),
        spans: &[Span],
        trees: &[Option<TreeQueries>],
        caches: &[&DeviceKv],
        layer: usize,
    ) -> Result<Tensor> {
        let h = candle_nn::ops::rms_norm(x, &self.attn_norm, self.eps)?;
        let rows = Rows {
            spans,
            trees,
            caches,
        };
        let x = (x + self.attention.forward(&h, cos_sin, &rows, layer)?)?;
        let h = candle_nn::ops::rms_norm(&x, &self.ffn_norm, self.eps)?;
        let mlp = (self.gate.forward(&h)?.silu()? * self.up.forward(&h)?)?;
        Ok((x + self.down.forward(&mlp)?)?)
    }
}
