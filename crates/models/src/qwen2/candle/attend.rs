//! Causal attention of a packed batch of rows over their K/V: batched matmuls with a mask.

use candle_core::Tensor;

use super::super::error::Result;
use super::cache::DeviceKv;
use crate::cpu::Span;

/// `q [tokens, heads, head_dim]` to `[tokens, heads, head_dim]`.
pub(crate) fn attend(
    q: &Tensor,
    spans: &[Span],
    caches: &[&DeviceKv],
    layer: usize,
    scale: f32,
) -> Result<Tensor> {
    let (_, heads, head_dim) = q.dims3()?;
    let mut outs = Vec::with_capacity(spans.len());
    for (span, cache) in spans.iter().zip(caches) {
        let (k_all, v_all) = cache.layer(layer);
        let kv_heads = k_all.dim(0)?;
        let group = heads / kv_heads;
        let total = span.past + span.len;
        // [heads, n, d] viewed as [kv_heads, group * n, d]: query heads of one KV head together.
        let q_row = q
            .narrow(0, span.start, span.len)?
            .transpose(0, 1)?
            .contiguous()?;
        let q_row = q_row.reshape((kv_heads, group * span.len, head_dim))?;
        let k = k_all.narrow(1, 0, total)?.contiguous()?;
        let v = v_all.narrow(1, 0, total)?.contiguous()?;
        let mask: Vec<f32> = (0..group * span.len)
            .flat_map(|gi| {
                let pos = span.past + gi % span.len;
                (0..total).map(move |t| if t <= pos { 0.0 } else { f32::NEG_INFINITY })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (1, group * span.len, total), q.device())?;
        let scores = (q_row.matmul(&k.t()?)? * f64::from(scale))?.broadcast_add(&mask)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let o = probs
            .matmul(&v)?
            .reshape((heads, span.len, head_dim))?
            .transpose(0, 1)?;
        outs.push(o);
    }
    Ok(Tensor::cat(&outs, 0)?.contiguous()?)
}
