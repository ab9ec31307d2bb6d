//! Causal attention of a packed batch over host K/V: one work unit per (token, KV head),
//! which reads each cached K and V row once for all the query heads of its group.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::isa::Isa;
use super::kv::KvBuffers;
use super::ops::{axpy, dot, softmax};
use super::pool::ThreadPool;
use super::with_isa;

/// Where one sequence's tokens sit in the packed batch and in its cache.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    pub start: usize,
    pub len: usize,
    pub past: usize,
}

/// Head layout of an attention layer.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each unit writes the disjoint output of its own (token, KV head).
unsafe impl Sync for OutPtr {}
unsafe impl Send for OutPtr {}

impl OutPtr {
    fn at(self, offset: usize) -> *mut f32 {
        // SAFETY: callers stay within the output buffer.
        unsafe { self.0.add(offset) }
    }
}

/// `q [tokens, heads, head_dim]` to `out [tokens, heads, head_dim]`; token `i` of span `s`
/// sees positions `0..=s.past + i` of its cache, which must already hold them.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    q: &[f32],
    spans: &[Span],
    caches: &[&KvBuffers],
    layer: usize,
    h: Heads,
    out: &mut [f32],
    pool: &ThreadPool,
    isa: Isa,
) {
    let tokens: usize = spans.iter().map(|s| s.len).sum();
    let group = h.heads / h.kv_heads;
    let width = h.heads * h.head_dim;
    assert!(q.len() >= tokens * width && out.len() >= tokens * width);
    let mut owner = Vec::with_capacity(tokens);
    for (r, s) in spans.iter().enumerate() {
        owner.extend((0..s.len).map(|i| (r, s.past + i)));
    }
    let units = tokens * h.kv_heads;
    let next = AtomicUsize::new(0);
    let out_ptr = OutPtr(out.as_mut_ptr());
    let unit = |u: usize| {
        let (token, kv_head) = (u / h.kv_heads, u % h.kv_heads);
        let (row, pos) = owner[token];
        let (k, v) = caches[row].head(layer, kv_head, pos + 1);
        let first = kv_head * group;
        let qs =
            &q[token * width + first * h.head_dim..token * width + (first + group) * h.head_dim];
        // SAFETY: the heads `first..first + group` of `token` belong to this unit alone.
        let o = unsafe {
            std::slice::from_raw_parts_mut(
                out_ptr.at(token * width + first * h.head_dim),
                group * h.head_dim,
            )
        };
        SCORES.with(|cell| {
            let mut scores = cell.borrow_mut();
            let len = pos + 1;
            scores.resize(group * len, 0.0);
            for (t, key) in k.chunks_exact(h.head_dim).enumerate() {
                for (i, qh) in qs.chunks_exact(h.head_dim).enumerate() {
                    scores[i * len + t] = dot(qh, key) * h.scale;
                }
            }
            for w in scores.chunks_exact_mut(len) {
                softmax(w);
            }
            o.fill(0.0);
            for (t, value) in v.chunks_exact(h.head_dim).enumerate() {
                for (i, oh) in o.chunks_exact_mut(h.head_dim).enumerate() {
                    axpy(scores[i * len + t], value, oh);
                }
            }
        });
    };
    let work = |_| loop {
        let u = next.fetch_add(1, Ordering::Relaxed);
        if u >= units {
            break;
        }
        with_isa(isa, || unit(u));
    };
    if units >= 2 {
        pool.run(&work);
    } else {
        work(0);
    }
}
