//! Causal attention of a packed batch of rows over their K/V.

use candle_core::Tensor;

use super::super::error::Result;
use super::cache::DeviceKv;
use crate::blocks::attention::masked_attention;
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
    let mut outs = Vec::with_capacity(rows.spans.len());
    for ((span, cache), tree) in rows.spans.iter().zip(rows.caches).zip(rows.trees) {
        let (k_all, v_all) = cache.layer(layer);
        let total = span.past + span.len;
        let visible = AttentionSpan {
            query_start: span.past,
            key_start: 0,
            window: None,
            scale,
            tree: tree.as_ref(),
        };
        outs.push(masked_attention(
            &q.narrow(0, span.start, span.len)?,
            &k_all.narrow(1, 0, total)?,
            &v_all.narrow(1, 0, total)?,
            visible,
        )?);
    }
    Ok(Tensor::cat(&outs, 0)?.contiguous()?)
}
