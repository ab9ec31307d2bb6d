//! Causal (optionally sliding-window) attention where each query attends to exactly the keys
//! it may see, with a fixed summation order: a query's output does not depend on the other
//! queries of its block.

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};

use super::dot::{axpy, dot};

/// Absolute positions of a block of queries and of the keys they attend to.
#[derive(Debug, Clone, Copy)]
pub struct AttentionSpan<'a> {
    /// Cache slot of the first query; query `t` sits in slot `query_start + t`, which is its
    /// position too unless the queries are nodes of a tree.
    pub query_start: usize,
    /// Slot of key row 0.
    pub key_start: usize,
    /// A query at position `p` sees keys in `(p - window, p]`; `None` sees every earlier key.
    pub window: Option<usize>,
    /// Multiplies the scores (Gemma 4 uses 1.0).
    pub scale: f32,
    /// The tree the queries are nodes of; `None`: a chain.
    pub tree: Option<&'a TreeQueries>,
}

/// Queries that are the last nodes of a token tree (see [`crate::tree`]): a node sits at the
/// position its depth gives and sees the slots before the root and its own ancestors only,
/// in slot order, which is the order its path run token by token would have them in.
#[derive(Debug, Clone)]
pub struct TreeQueries {
    /// Slot (and position) of the root.
    root: usize,
    /// Per query: the nodes from the root to it, itself last.
    paths: Vec<Vec<usize>>,
}

impl TreeQueries {
    /// The `queries` new tokens after `past` cached slots, as the last nodes of the tree
    /// `parents` (its earlier nodes cached).
    pub fn new(parents: &[u32], queries: usize, past: usize) -> Self {
        let root = crate::tree::root(parents, queries, past);
        let nodes = parents.len() + 1;
        let paths = (nodes.saturating_sub(queries)..nodes)
            .map(|node| {
                let mut path = vec![node];
                while let Some(&at) = path.last().filter(|&&at| at > 0) {
                    path.push(parents[at - 1] as usize);
                }
                path.reverse();
                path
            })
            .collect();
        Self { root, paths }
    }

    /// Position of query `t`.
    pub fn position(&self, t: usize) -> usize {
        self.root + self.paths[t].len() - 1
    }
}

impl AttentionSpan<'_> {
    /// The position of query `t`.
    pub fn position(&self, t: usize) -> usize {
        match self.tree {
            Some(tree) => tree.position(t),
            None => self.query_start + t,
        }
    }

    /// The key rows query `t` sees, ascending: its window of the slots before the tree's root
    /// (its own slot, for a chain), then its ancestors in the window.
    pub fn visible(&self, t: usize) -> impl Iterator<Item = usize> + '_ {
        let pos = self.position(t);
        let first = match self.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        }
        .max(self.key_start);
        let (end, path, root) = match self.tree {
            Some(tree) => (tree.root, tree.paths[t].as_slice(), tree.root),
            None => (pos + 1, &[][..], 0),
        };
        let key_start = self.key_start;
        (first.min(end)..end)
            .chain(
                path.iter()
                    .enumerate()
                    .filter(move |&(depth, _)| root + depth >= first)
                    .map(move |(_, &node)| root + node),
            )
            .map(move |slot| slot - key_start)
    }

    /// The additive mask of `queries` queries over `keys` key rows, `[queries, keys]`: 0
    /// where a query sees the key, -inf elsewhere.
    pub fn mask(&self, queries: usize, keys: usize) -> Vec<f32> {
        let mut mask = vec![f32::NEG_INFINITY; queries * keys];
        for (t, row) in mask.chunks_mut(keys.max(1)).enumerate() {
            for key in self.visible(t).filter(|&key| key < keys) {
                row[key] = 0.0;
            }
        }
        mask
    }

    /// One past the last slot any query reads.
    fn keys_needed(&self, queries: usize) -> usize {
        match self.tree {
            Some(tree) => tree.root + tree.paths.iter().flatten().max().map_or(0, |n| n + 1),
            None => self.query_start + queries,
        }
    }
}

struct ExactAttention<'a>(AttentionSpan<'a>);

fn slice<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    let data = s.as_slice::<f32>()?;
    let (start, end) = l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg(format!("exact attention: {what} must be contiguous"))
    })?;
    Ok(&data[start..end])
}

impl CustomOp3 for ExactAttention<'_> {
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
        let needed = span.keys_needed(t_len);
        let tree_fits = span.tree.is_none_or(|tree| tree.paths.len() == t_len);
        if span.key_start > span.query_start || span.key_start + s_len < needed || !tree_fits {
            candle_core::bail!(
                "exact attention: keys cover slots {}..{} but {t_len} queries need up to {needed}",
                span.key_start,
                span.key_start + s_len,
            );
        }
        let q = slice(sq, lq, "q")?;
        let k = slice(sk, lk, "k")?;
        let v = slice(sv, lv, "v")?;
        let group = hq / hkv;
        let mut out = vec![0f32; t_len * hq * d];
        crate::cpu::ThreadPool::global().for_each_chunk_mut(&mut out, d, false, |row, o| {
            let (t, h) = (row / hq, row % hq);
            let kv_head = h / group;
            let qh = &q[(t * hq + h) * d..(t * hq + h + 1) * d];
            let base = kv_head * s_len * d;
            let mut scores: Vec<f32> = span
                .visible(t)
                .map(|s| dot(qh, &k[base + s * d..base + (s + 1) * d]) * span.scale)
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for x in scores.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
            for (i, s) in span.visible(t).enumerate() {
                axpy(scores[i] / sum, &v[base + s * d..base + (s + 1) * d], o);
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((t_len, hq, d))))
    }
}

/// `q [t, hq, d]` over `k`, `v` `[hkv, s, d]`, giving `[t, hq, d]`; CPU f32 only.
pub fn exact_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    span: AttentionSpan<'_>,
) -> Result<Tensor> {
    q.contiguous()?
        .apply_op3_no_bwd(&k.contiguous()?, &v.contiguous()?, &ExactAttention(span))
}
