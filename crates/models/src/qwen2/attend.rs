//! Causal attention of a packed batch of rows over their KV caches.
//!
//! The queries of all rows are packed as `[tokens, heads, head_dim]` with no padding; row `r`
//! owns tokens `start..start + len` at positions `past..past + len` of its own cache. On CPU
//! each (token, head) is computed by one fixed-order loop over exactly the keys it may see,
//! read in place from the cache buffers, so its result does not depend on the block or the
//! batch it arrived in. Other devices use batched matmuls with a mask.

use candle_core::{Device, Tensor};

use super::cache::KvCache;
use super::error::Result;
use super::kernels::{axpy, cpu_slice, dot, parallel_units};

/// Where one row's tokens sit in the packed batch and in its cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowSpan {
    pub start: usize,
    pub len: usize,
    pub past: usize,
}

/// `q [tokens, heads, head_dim]` to `[tokens, heads, head_dim]`.
pub(crate) fn attend(
    q: &Tensor,
    spans: &[RowSpan],
    caches: &[&KvCache],
    layer: usize,
    scale: f32,
    exact_cpu: bool,
) -> Result<Tensor> {
    if exact_cpu && q.device().is_cpu() {
        attend_cpu(q, spans, caches, layer, scale)
    } else {
        attend_masked(q, spans, caches, layer, scale)
    }
}

fn attend_cpu(
    q: &Tensor,
    spans: &[RowSpan],
    caches: &[&KvCache],
    layer: usize,
    scale: f32,
) -> Result<Tensor> {
    let (tokens, heads, head_dim) = q.dims3()?;
    let q = q.contiguous()?;
    let (q_storage, q_layout) = q.storage_and_layout();
    let q_all = cpu_slice(&q_storage, q_layout, "q")?;

    let guards: Vec<_> = caches
        .iter()
        .map(|c| {
            (
                c.layer(layer).k.storage_and_layout(),
                c.layer(layer).v.storage_and_layout(),
            )
        })
        .collect();
    let mut rows = Vec::with_capacity(guards.len());
    for ((k_storage, k_layout), (v_storage, v_layout)) in &guards {
        let (kv_heads, capacity, _) = k_layout.shape().dims3()?;
        let k = cpu_slice(k_storage, k_layout, "cached K")?;
        let v = cpu_slice(v_storage, v_layout, "cached V")?;
        rows.push((k, v, kv_heads, capacity));
    }
    // For each packed token: its row and absolute position.
    let mut token_row = Vec::with_capacity(tokens);
    for (r, span) in spans.iter().enumerate() {
        token_row.extend((0..span.len).map(|i| (r, span.past + i)));
    }

    let out = parallel_units(tokens * heads, head_dim, |unit, o| {
        let (token, head) = (unit / heads, unit % heads);
        let (r, pos) = token_row[token];
        let (k, v, kv_heads, capacity) = rows[r];
        let kv_head = head / (heads / kv_heads);
        let base = kv_head * capacity * head_dim;
        let qh = &q_all[unit * head_dim..(unit + 1) * head_dim];
        let key = |t: usize| &k[base + t * head_dim..base + (t + 1) * head_dim];
        let value = |t: usize| &v[base + t * head_dim..base + (t + 1) * head_dim];
        let mut weights: Vec<f32> = (0..=pos).map(|t| dot(qh, key(t)) * scale).collect();
        let max = weights.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for w in weights.iter_mut() {
            *w = (*w - max).exp();
            sum += *w;
        }
        for (t, w) in weights.iter().enumerate() {
            axpy(*w, value(t), o);
        }
        let inv = 1.0 / sum;
        o.iter_mut().for_each(|x| *x *= inv);
    });
    drop(q_storage);
    Ok(Tensor::from_vec(
        out,
        (tokens, heads, head_dim),
        &Device::Cpu,
    )?)
}

fn attend_masked(
    q: &Tensor,
    spans: &[RowSpan],
    caches: &[&KvCache],
    layer: usize,
    scale: f32,
) -> Result<Tensor> {
    let (_, heads, head_dim) = q.dims3()?;
    let mut outs = Vec::with_capacity(spans.len());
    for (span, cache) in spans.iter().zip(caches) {
        let kv = cache.layer(layer);
        let kv_heads = kv.k.dim(0)?;
        let group = heads / kv_heads;
        let total = span.past + span.len;
        // [heads, n, d] viewed as [kv_heads, group * n, d]: query heads of one KV head together.
        let q_row = q
            .narrow(0, span.start, span.len)?
            .transpose(0, 1)?
            .contiguous()?;
        let q_row = q_row.reshape((kv_heads, group * span.len, head_dim))?;
        let k = kv.k.narrow(1, 0, total)?.contiguous()?;
        let v = kv.v.narrow(1, 0, total)?.contiguous()?;
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
