//! Causal attention of a packed batch of rows over their K/V: batched matmuls with a mask.

use candle_core::Tensor;

use super::super::error::Result;
use super::cache::DeviceKv;
use crate::cpu::Span;
use crate::exact::{AttentionSpan, TreeQueries};

/// The rows of a packed batch, as attention sees them.
pub(crate) struct Rows<'a> {
    pub spans: &'a [Span],
    /// Per row, the tree its tokens are the last nodes of (`None`: a chain).
    pub trees: &'a [Option<TreeQueries>],
    pub caches: &'a [&'a DeviceKv],
}

/// `q [tokens, heads, head_dim]` to `[tokens, heads, head_dim]`: each token attends to the
/// slots it sees (a chain's token every earlier one and itself, a tree's node the slots
/// before its root and its ancestors).
pub(crate) fn attend(q: &Tensor, rows: &Rows<'_>, layer: usize, scale: f32) -> Result<Tensor> {
    let (_, heads, head_dim) = q.dims3()?;
    let mut outs = Vec::with_capacity(rows.spans.len());
    for ((span, cache), tree) in rows.spans.iter().zip(rows.caches).zip(rows.trees) {
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
        let visible = AttentionSpan {
            query_start: span.past,
            key_start: 0,
            window: None,
            scale,
            tree: tree.as_ref(),
        };
        // The query heads of one KV head are `group` copies of the block's queries.
        let mask = visible.mask(span.len, total).repeat(group);
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
