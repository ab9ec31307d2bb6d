//! Grouped-query self-attention with biased Q/K/V projections (the Qwen2 block's first half).

use candle_core::Tensor;

use super::super::error::Result;
use super::attend::{attend, Rows};
use super::linear::QLinear;
use crate::blocks::rope::rotate;

pub(crate) struct Attention {
    pub(crate) q: QLinear,
    pub(crate) k: QLinear,
    pub(crate) v: QLinear,
    pub(crate) o: QLinear,
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
}

impl Attention {
    /// `x [tokens, hidden]` of a packed batch; writes each row's new K/V into its cache at the
    /// row's positions before attending, so a token sees itself and every earlier token.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        cos_sin: &(Tensor, Tensor),
        rows: &Rows<'_>,
        layer: usize,
    ) -> Result<Tensor> {
        let tokens = x.dim(0)?;
        let (cos, sin) = cos_sin;
        let rotate_heads = |t: Tensor, heads: usize| -> Result<Tensor> {
            Ok(rotate(
                &t.reshape((tokens, heads, self.head_dim))?,
                cos,
                sin,
            )?)
        };
        let q = rotate_heads(self.q.forward(x)?, self.heads)?;
        let k = rotate_heads(self.k.forward(x)?, self.kv_heads)?;
        let v = self
            .v
            .forward(x)?
            .reshape((tokens, self.kv_heads, self.head_dim))?;
        for (span, cache) in rows.spans.iter().zip(rows.caches) {
            let k_row = k.narrow(0, span.start, span.len)?;
            let v_row = v.narrow(0, span.start, span.len)?;
            cache.write(layer, span.past, &k_row, &v_row)?;
        }
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        let out = attend(&q, rows, layer, scale)?;
        self.o
            .forward(&out.reshape((tokens, self.heads * self.head_dim))?)
    }
}
