//! Causal (optionally sliding-window) attention where each query attends to exactly the keys
//! it may see, with a fixed summation order: a query's output does not depend on the other
//! queries of its block.

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};

use super::dot::{axpy, dot};

/// Absolute positions of a block of queries and of the keys they attend to.
#[derive(Debug, Clone, Copy)]
pub struct AttentionSpan {
    /// Position of the first query; query `t` sits at `query_start + t`.
    pub query_start: usize,
    /// Position of key row 0.
    pub key_start: usize,
    /// A query at position `p` sees keys in `(p - window, p]`; `None` sees every earlier key.
    pub window: Option<usize>,
    /// Multiplies the scores (Gemma 4 uses 1.0).
    pub scale: f32,
}

struct ExactAttention(AttentionSpan);

fn slice<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    let data = s.as_slice::<f32>()?;
    let (start, end) = l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg(format!("exact attention: {what} must be contiguous"))
    })?;
    Ok(&data[start..end])
}

impl CustomOp3 for ExactAttention {
    fn name(&self) -> &'static str {
        "exact-attention"
    }

    fn cpu_fwd(
        &self,
        sq: &CpuStorage,
        lq: &Layout,
        sk: &CpuStorage,
        lk: &Layout,
        sv: &CpuStorage,
        lv: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let span = self.0;
        let (t_len, hq, d) = lq.shape().dims3()?;
        let (hkv, s_len, dk) = lk.shape().dims3()?;
        if dk != d || lv.shape().dims() != lk.shape().dims() || hkv == 0 || !hq.is_multiple_of(hkv)
        {
            candle_core::bail!(
                "exact attention: q {:?}, k {:?}, v {:?} do not fit",
                lq.shape().dims(),
                lk.shape().dims(),
                lv.shape().dims()
            );
        }
        let last_query = span.query_start + t_len;
        if span.key_start > span.query_start || span.key_start + s_len < last_query {
            candle_core::bail!(
                "exact attention: keys cover positions {}..{} but queries need up to {}",
                span.key_start,
                span.key_start + s_len,
                last_query
            );
        }
        let q = slice(sq, lq, "q")?;
        let k = slice(sk, lk, "k")?;
        let v = slice(sv, lv, "v")?;
        let group = hq / hkv;
        let mut out = vec![0f32; t_len * hq * d];
        crate::cpu::ThreadPool::global().for_each_chunk_mut(&mut out, d, false, |row, o| {
            let (t, h) = (row / hq, row % hq);
            let pos = span.query_start + t;
            let first = match span.window {
                Some(w) => (pos + 1).saturating_sub(w).max(span.key_start),
                None => span.key_start,
            };
            let (lo, hi) = (first - span.key_start, pos + 1 - span.key_start);
            let kv_head = h / group;
            let qh = &q[(t * hq + h) * d..(t * hq + h + 1) * d];
            let base = kv_head * s_len * d;
            let mut scores: Vec<f32> = (lo..hi)
                .map(|s| dot(qh, &k[base + s * d..base + (s + 1) * d]) * span.scale)
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for x in scores.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
            for (i, s) in (lo..hi).enumerate() {
                axpy(scores[i] / sum, &v[base + s * d..base + (s + 1) * d], o);
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((t_len, hq, d))))
    }
}

/// `q [t, hq, d]` over `k`, `v` `[hkv, s, d]`, giving `[t, hq, d]`; CPU f32 only.
pub fn exact_attention(q: &Tensor, k: &Tensor, v: &Tensor, span: AttentionSpan) -> Result<Tensor> {
    q.contiguous()?
        .apply_op3_no_bwd(&k.contiguous()?, &v.contiguous()?, &ExactAttention(span))
}
