//! Causal attention of a packed batch over host K/V.
//!
//! A work unit is one KV head of a block of up to [`QUERY_BLOCK`] consecutive tokens of one
//! sequence: it reads each cached K tile and V row once for every query head of its group
//! and every token of the block. Each (token, head) output is still computed by one fixed
//! sequence of operations (each score a multiply-add chain over the head's dimensions, its
//! softmax, its weighted sum in key order), so the block a token lands in never changes its
//! result.

use std::cell::RefCell;

use super::isa::Isa;
use super::kv::{KvBuffers, KEY_TILE};
use super::lanes::portable::Portable;
use super::lanes::Lanes;
use super::pool::ThreadPool;

/// Tokens of one sequence a unit serves.
const QUERY_BLOCK: usize = 8;

/// Query rows whose scores against one key tile are accumulated together: each score is a
/// chain of dependent multiply-adds, so a core needs about eight chains in flight to keep
/// its multiply-add units busy (four leave half of them idle on a 4-cycle latency). AVX2
/// has registers for four (two per row).
const QUERY_ROWS: usize = 8;
const QUERY_ROWS_AVX2: usize = 4;

/// How far ahead of the K tile or V row being read the next lines are asked for. Cached
/// K/V is read from memory once per step (a weight stream passes through the caches
/// between layers), so without a hint a long context waits on it: at 1,500 tokens on a
/// 2-core Xeon (family 6, model 207) attention took 7.3-7.9 ms of a 1.5B target's step,
/// 5.2-5.7 ms asked for 4 KiB ahead (one run 6.2; 2 KiB: 5.9-6.5 ms; 8 and 16 KiB no
/// better than 4).
const KV_AHEAD: usize = 4096;

const LANES: usize = 16;
const _: () = assert!(LANES == KEY_TILE, "one vector of scores per key tile");

/// Where one sequence's tokens sit in the packed batch and in its cache.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    pub start: usize,
    pub len: usize,
    pub past: usize,
}

impl Span {
    /// The spans of rows of `(new tokens, positions already cached)`, packed in order.
    pub fn pack(rows: impl IntoIterator<Item = (usize, usize)>) -> Vec<Span> {
        let mut spans = Vec::new();
        Self::pack_into(rows, &mut spans);
        spans
    }

    /// [`Self::pack`] into `spans`, reusing its storage.
    pub fn pack_into(rows: impl IntoIterator<Item = (usize, usize)>, spans: &mut Vec<Span>) {
        spans.clear();
        let mut start = 0;
        spans.extend(rows.into_iter().map(|(len, past)| {
            let span = Span { start, len, past };
            start += len;
            span
        }));
    }

    /// The positions of the span's tokens in their sequence.
    pub fn positions(&self) -> std::ops::Range<usize> {
        self.past..self.past + self.len
    }
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
    static PATH: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each unit writes the disjoint outputs of its own tokens and heads.
unsafe impl Sync for OutPtr {}
// SAFETY: as for Sync: the pointer outlives the scoped workers it is sent to.
unsafe impl Send for OutPtr {}

impl OutPtr {
    /// # Safety
    /// `offset` must stay inside the output.
    unsafe fn add(self, offset: usize) -> *mut f32 {
        self.0.add(offset)
    }
}

/// The tree a span's tokens form instead of a chain: node `j + 1`'s parent is node
/// `parents[j]` (an earlier node; node 0 is the root, after the cached positions). Node `i`
/// sits at cache slot `past + i` and sees the cache and its ancestors only.
#[derive(Clone, Copy)]
struct UnitTree<'a> {
    parents: &'a [u32],
    /// Cached positions before the tree (its root's slot).
    past: usize,
    /// The unit's first node.
    offset: usize,
}

impl UnitTree<'_> {
    /// The nodes from the root to `node`, in order (each node's index is at least its
    /// depth), into `path`.
    fn path_into(&self, node: usize, path: &mut Vec<usize>) {
        path.clear();
        let mut at = node;
        path.push(at);
        while at > 0 {
            at = self.parents[at - 1] as usize;
            path.push(at);
        }
        path.reverse();
    }
}

/// One unit's inputs.
struct Unit<'a> {
    /// Queries of the block's tokens, `[tokens, heads, head_dim]` from its first token.
    q: &'a [f32],
    out: OutPtr,
    /// Position of the block's first token; the block has `tokens` consecutive ones.
    first_pos: usize,
    tokens: usize,
    kv_head: usize,
    k: &'a [f32],
    v: &'a [f32],
    h: Heads,
    tree: Option<UnitTree<'a>>,
}

/// `q [tokens, heads, head_dim]` to `out [tokens, heads, head_dim]`; token `i` of span `s`
/// sees positions `0..=s.past + i` of cache `s`, which must already hold them. A cache is
/// anything that lends its [`KvBuffers`], so a caller passes its own rows without building
/// a list of references every layer.
#[allow(clippy::too_many_arguments)]
pub fn attend<C: AsRef<KvBuffers> + Sync>(
    q: &[f32],
    spans: &[Span],
    caches: &[C],
    layer: usize,
    h: Heads,
    out: &mut [f32],
    pool: &ThreadPool,
    isa: Isa,
) {
    attend_trees(q, spans, &[], caches, layer, h, out, pool, isa)
}

/// [`attend`] where span `s`'s tokens are the last nodes of the tree `trees[s]` (node
/// `j + 1`'s parent is node `trees[s][j]`; an empty tree or none at all: a chain). The tree's
/// `n = trees[s].len() + 1` nodes sit at the last `n` positions of the cache once the span
/// is in it (the earlier ones from earlier forwards); each sees the positions before the
/// tree and its own ancestors only, and its output is bit for bit what attending its path
/// token by token gives (the scores of its visible keys are gathered in path order before
/// the softmax, and the weighted sum runs over them in the same order).
#[allow(clippy::too_many_arguments)]
pub fn attend_trees<C: AsRef<KvBuffers> + Sync>(
    q: &[f32],
    spans: &[Span],
    trees: &[&[u32]],
    caches: &[C],
    layer: usize,
    h: Heads,
    out: &mut [f32],
    pool: &ThreadPool,
    isa: Isa,
) {
    assert!(
        trees.is_empty() || trees.len() == spans.len(),
        "one tree per span, or none"
    );
    for (span, tree) in spans.iter().zip(trees) {
        assert!(
            tree.is_empty()
                || (tree.len() + 1 >= span.len
                    && tree.len() < span.past + span.len
                    && tree.iter().enumerate().all(|(j, &p)| (p as usize) <= j)),
            "a tree's nodes follow their parents"
        );
    }
    let tokens: usize = spans.iter().map(|s| s.len).sum();
    let width = h.heads * h.head_dim;
    assert!(q.len() >= tokens * width && out.len() >= tokens * width);
    assert!(h.kv_heads > 0 && h.heads.is_multiple_of(h.kv_heads));
    // Units: per span, its blocks of tokens, each for every KV head.
    let blocks: usize = spans.iter().map(|s| s.len.div_ceil(QUERY_BLOCK)).sum();
    let units = blocks * h.kv_heads;
    let out_ptr = OutPtr(out.as_mut_ptr());
    pool.for_each_index(units, false, |u| {
        let (mut block, kv_head) = (u / h.kv_heads, u % h.kv_heads);
        let mut row = 0;
        while block >= spans[row].len.div_ceil(QUERY_BLOCK) {
            block -= spans[row].len.div_ceil(QUERY_BLOCK);
            row += 1;
        }
        let span = spans[row];
        let offset = block * QUERY_BLOCK;
        let count = QUERY_BLOCK.min(span.len - offset);
        let first_pos = span.past + offset;
        let (k, v) = caches[row].as_ref().head(layer, kv_head, first_pos + count);
        let first_token = span.start + offset;
        let tree = trees
            .get(row)
            .filter(|parents| !parents.is_empty())
            .map(|&parents| {
                // Nodes of the tree already in the cache, before the span's.
                let earlier = parents.len() + 1 - span.len;
                UnitTree {
                    parents,
                    past: span.past - earlier,
                    offset: earlier + offset,
                }
            });
        let unit = Unit {
            q: &q[first_token * width..(first_token + count) * width],
            // SAFETY: stays inside `out` (checked above).
            out: OutPtr(unsafe { out_ptr.add(first_token * width) }),
            first_pos,
            tokens: count,
            kv_head,
            k,
            v,
            h,
            tree,
        };
        // Taken out of the thread-local, so no closure stands between the kernel and the
        // CPU features it is compiled for.
        let mut scores = SCORES.with(|cell| cell.take());
        run_unit(&unit, &mut scores, isa);
        SCORES.with(|cell| *cell.borrow_mut() = scores);
    });
}

fn run_unit(unit: &Unit<'_>, scores: &mut Vec<f32>, isa: Isa) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa` is a supported kernel set (see `Isa::detect`).
        Isa::Avx512Vnni if isa.supported() => unsafe { unit_avx512(unit, scores) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::AvxVnni | Isa::Avx2 if isa.supported() => unsafe { unit_avx2(unit, scores) },
        // SAFETY: the portable lanes need no CPU feature.
        _ => unsafe { unit_body::<Portable, QUERY_ROWS>(unit, scores) },
    }
}

super::avx512_kernel! {
    unsafe fn unit_avx512(unit: &Unit<'_>, scores: &mut Vec<f32>) {
        unit_body::<super::lanes::avx512::Avx512, QUERY_ROWS>(unit, scores)
    }
}

super::avx2_kernel! {
    unsafe fn unit_avx2(unit: &Unit<'_>, scores: &mut Vec<f32>) {
        unit_body::<super::lanes::avx2::Avx2<false>, QUERY_ROWS_AVX2>(unit, scores)
    }
}

/// # Safety
/// `L`'s CPU features must be present.
#[inline(always)]
unsafe fn unit_body<L: Lanes, const R: usize>(u: &Unit<'_>, scores: &mut Vec<f32>) {
    let h = u.h;
    let (d, group) = (h.head_dim, h.heads / h.kv_heads);
    let width = h.heads * d;
    let keys = u.first_pos + u.tokens;
    // Each (token, head) row of scores is padded to whole key tiles.
    let stride = keys.next_multiple_of(KEY_TILE);
    scores.resize(u.tokens * group * stride, 0.0);
    // Row r = (token i, head g); token i sees keys 0..=first_pos + i.
    let query = |r: usize| {
        let (i, g) = (r / group, r % group);
        let at = i * width + (u.kv_head * group + g) * d;
        &u.q[at..at + d]
    };
    for (tile, keys_tile) in u.k.chunks_exact(d * KEY_TILE).enumerate() {
        let first_key = tile * KEY_TILE;
        // Rows whose token sees at least the tile's first key.
        let mut r = first_key.saturating_sub(u.first_pos) * group;
        let rows = u.tokens * group;
        while r < rows {
            let n = R.min(rows - r);
            let qs: [&[f32]; R] = std::array::from_fn(|j| query(r + j.min(n - 1)));
            let acc = tile_scores::<L, R>(keys_tile, &qs, d);
            for (j, a) in acc.iter().take(n).enumerate() {
                let row = &mut scores[(r + j) * stride + first_key..][..KEY_TILE];
                L::store_f(row.as_mut_ptr(), L::mul_f(*a, L::splat_f(h.scale)));
            }
            r += n;
        }
    }
    if let Some(tree) = u.tree {
        tree_sums::<L, R>(u, tree, scores, stride);
        return;
    }
    for r in 0..u.tokens * group {
        let i = r / group;
        softmax(&mut scores[r * stride..r * stride + u.first_pos + i + 1]);
    }
    let rows = u.tokens * group;
    let limit = |r: usize| u.first_pos + r / group + 1;
    sums::<L, R>(u, scores, stride, rows, &limit);
}

/// Each row's output of `u`: `out_r = sum_t p[r][t] * v[t]` over keys `0..limit(r)`, in key
/// order, register blocked for the head sizes that fit.
///
/// # Safety
/// `L`'s CPU features must be present.
#[inline(always)]
unsafe fn sums<L: Lanes, const R: usize>(
    u: &Unit<'_>,
    scores: &[f32],
    stride: usize,
    rows: usize,
    limit: &impl Fn(usize) -> usize,
) {
    let d = u.h.head_dim;
    let out_row = |r: usize| out_row_of(u, r);
    match d {
        // Four rows of 64 or two of 128 dimensions: 16 vector sums, within AVX-512's
        // registers; AVX2's hold half as many.
        64 if R >= QUERY_ROWS => {
            weighted_sums::<L, 4, 4>(scores, stride, rows, limit, u.v, &out_row)
        }
        64 => weighted_sums::<L, 4, 2>(scores, stride, rows, limit, u.v, &out_row),
        128 if R >= QUERY_ROWS => {
            weighted_sums::<L, 8, 2>(scores, stride, rows, limit, u.v, &out_row)
        }
        128 => weighted_sums::<L, 8, 1>(scores, stride, rows, limit, u.v, &out_row),
        _ => {
            for r in 0..rows {
                // SAFETY: row `r`'s output (`d` values) belongs to this unit alone.
                let o = unsafe { std::slice::from_raw_parts_mut(out_row(r), d) };
                o.fill(0.0);
                for (t, value) in u.v.chunks_exact(d).take(limit(r)).enumerate() {
                    axpy_fused(scores[r * stride + t], value, o);
                }
            }
        }
    }
}

/// Where row `r` (token `r / group`, head `r % group` of the unit's group) writes its output.
fn out_row_of(u: &Unit<'_>, r: usize) -> *mut f32 {
    let (d, group) = (u.h.head_dim, u.h.heads / u.h.kv_heads);
    let (i, g) = (r / group, r % group);
    // SAFETY: this unit alone writes head `g` of its group for token `i`, inside `out`.
    unsafe { u.out.add(i * u.h.heads * d + (u.kv_head * group + g) * d) }
}

/// The softmax and weighted sums of a tree unit whose scores are computed: each row's
/// visible scores (the cached positions', then its path's in order) are gathered to the
/// front of its row, where attending the path token by token would hold them, so the
/// softmax sees the same values in the same lanes; the cached keys' sum runs register
/// blocked as for a chain and the path's keys are then added in order, each a fused
/// multiply-add as in the blocked sum.
///
/// # Safety
/// `L`'s CPU features must be present.
#[inline(always)]
unsafe fn tree_sums<L: Lanes, const R: usize>(
    u: &Unit<'_>,
    tree: UnitTree<'_>,
    scores: &mut [f32],
    stride: usize,
) {
    let h = u.h;
    let (d, group) = (h.head_dim, h.heads / h.kv_heads);
    let rows = u.tokens * group;
    let mut path = PATH.with(|cell| cell.take());
    let mut depths = Vec::with_capacity(u.tokens);
    for i in 0..u.tokens {
        tree.path_into(tree.offset + i, &mut path);
        for g in 0..group {
            let row = &mut scores[(i * group + g) * stride..][..stride];
            for (k, &node) in path.iter().enumerate() {
                row[tree.past + k] = row[tree.past + node];
            }
            softmax(&mut row[..tree.past + path.len()]);
        }
        depths.push(path.len());
    }
    let cached = |_: usize| tree.past;
    sums::<L, R>(u, scores, stride, rows, &cached);
    for (i, &depth) in depths.iter().enumerate() {
        tree.path_into(tree.offset + i, &mut path);
        debug_assert_eq!(path.len(), depth);
        for g in 0..group {
            let r = i * group + g;
            // SAFETY: row `r`'s output (`d` values) belongs to this unit alone.
            let o = unsafe { std::slice::from_raw_parts_mut(out_row_of(u, r), d) };
            for (k, &node) in path.iter().enumerate() {
                let value = &u.v[(tree.past + node) * d..][..d];
                axpy_fused(scores[r * stride + tree.past + k], value, o);
            }
        }
    }
    PATH.with(|cell| *cell.borrow_mut() = path);
}

/// The scores of `R` query rows against one key tile (`[d, KEY_TILE]`): for each row and
/// key, one multiply-add chain over the dimensions in order, the rows' chains interleaved.
///
/// # Safety
/// `L`'s CPU features must be present.
#[inline(always)]
unsafe fn tile_scores<L: Lanes, const R: usize>(
    keys: &[f32],
    qs: &[&[f32]; R],
    d: usize,
) -> [L::F; R] {
    assert!(keys.len() >= d * KEY_TILE && qs.iter().all(|q| q.len() >= d));
    let (k, q) = (keys.as_ptr(), qs.map(|q| q.as_ptr()));
    let mut acc = [L::zero_f(); R];
    for dim in 0..d {
        // One line of the tile per dimension; the tiles of a head follow one another.
        L::prefetch((k.add(dim * KEY_TILE) as *const u8).wrapping_add(KV_AHEAD));
        // SAFETY: `dim < d`, and both inputs hold `d` dimensions (checked above).
        let kd = L::load_f32(k.add(dim * KEY_TILE) as *const u8);
        for j in 0..R {
            acc[j] = L::fma_f(L::splat_f(*q[j].add(dim)), kd, acc[j]);
        }
    }
    acc
}

/// `out_r = sum_t p[r][t] * v[t]` over each row's keys `0..limit(r)`, in key order, for `N`
/// rows at a time whose sums (`V` vectors each, `16 * V` dimensions) stay in registers while
/// every V row is read once for them. The keys every row of a group sees run without a
/// per-row test.
///
/// # Safety
/// `L`'s CPU features must be present.
#[inline(always)]
unsafe fn weighted_sums<L: Lanes, const V: usize, const N: usize>(
    scores: &[f32],
    stride: usize,
    rows: usize,
    limit: &impl Fn(usize) -> usize,
    v: &[f32],
    out_row: &impl Fn(usize) -> *mut f32,
) {
    let d = 16 * V;
    let mut r = 0;
    while r < rows {
        let n = N.min(rows - r);
        // Rows past `n` repeat the last one; their sums are dropped.
        let row = |j: usize| r + j.min(n - 1);
        let limits: [usize; N] = std::array::from_fn(|j| limit(row(j)));
        let shared = limits.iter().copied().min().unwrap_or(0);
        let keys = limits.iter().copied().max().unwrap_or(0);
        assert!(keys <= stride && v.len() >= keys * d && scores.len() >= (row(N - 1) + 1) * stride);
        let p: [*const f32; N] = std::array::from_fn(|j| scores.as_ptr().add(row(j) * stride));
        let mut acc = [[L::zero_f(); V]; N];
        // SAFETY (both loops): `t < keys`, within every row's scores and within `v`
        // (checked above).
        for t in 0..shared {
            add_key::<L, V, N>(&mut acc, &p, v.as_ptr().add(t * d), t, |_| true);
        }
        for t in shared..keys {
            add_key::<L, V, N>(&mut acc, &p, v.as_ptr().add(t * d), t, |j| t < limits[j]);
        }
        for (j, a) in acc.iter().take(n).enumerate() {
            // SAFETY: row `r + j`'s output (`d` values) belongs to this unit alone.
            let o = out_row(r + j);
            for (c, x) in a.iter().enumerate() {
                L::store_f(o.add(16 * c), *x);
            }
        }
        r += n;
    }
}

/// Adds key `t`'s V row (`16 * V` values at `value`), weighted by each row's score at `p[j]
/// + t`, to the sums of the rows `j` that see it.
///
/// # Safety
/// `L`'s CPU features must be present; `value` and every seeing row's score must be readable.
#[inline(always)]
unsafe fn add_key<L: Lanes, const V: usize, const N: usize>(
    acc: &mut [[L::F; V]; N],
    p: &[*const f32; N],
    value: *const f32,
    t: usize,
    sees: impl Fn(usize) -> bool,
) {
    for c in 0..V {
        // The V rows of a head follow one another. Every group of rows asks, whether or not
        // an earlier group left them cached: a head's V need not stay in a smaller cache.
        L::prefetch((value.add(16 * c) as *const u8).wrapping_add(KV_AHEAD));
    }
    let value: [L::F; V] = std::array::from_fn(|c| L::load_f32(value.add(16 * c) as *const u8));
    for (j, (a, pj)) in acc.iter_mut().zip(p).enumerate() {
        if sees(j) {
            let weight = L::splat_f(*pj.add(t));
            for (x, vx) in a.iter_mut().zip(&value) {
                *x = L::fma_f(weight, *vx, *x);
            }
        }
    }
}

/// `y += alpha * x`, fused.
#[inline(always)]
fn axpy_fused(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = alpha.mul_add(*xi, *yi);
    }
}

/// Softmax in place: lane-wise max and sum (fixed order), exponentials in one pass.
#[inline(always)]
fn softmax(w: &mut [f32]) {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    for chunk in w.chunks(LANES) {
        for (m, v) in lanes.iter_mut().zip(chunk) {
            // A plain comparison (a lane never holds NaN), which vectorizes to a maximum.
            *m = if *v > *m { *v } else { *m };
        }
    }
    let max = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sums = [0f32; LANES];
    for chunk in w.chunks_mut(LANES) {
        for (s, v) in sums.iter_mut().zip(chunk) {
            *v = super::ops::exp(*v - max);
            *s += *v;
        }
    }
    let inv = 1.0 / super::ops::reduce(sums);
    for v in w.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let mut w: Vec<f32> = (0..37)
            .map(|i| ((i * 13) % 17) as f32 * 0.3 - 2.0)
            .collect();
        let before = w.clone();
        softmax(&mut w);
        assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        for (a, b) in before.iter().zip(&before[1..]) {
            let (i, j) = (
                before.iter().position(|x| x == a).unwrap(),
                before.iter().position(|x| x == b).unwrap(),
            );
            assert_eq!(a < b, w[i] < w[j]);
        }
    }

    /// Every node of a tree attends as its path token by token, for every head size and
    /// kernel set, with the tree in one span or its last nodes after earlier ones.
    #[test]
    fn a_tree_node_attends_like_its_path_alone() {
        for head_dim in [32, 64, 128] {
            tree_nodes_attend_like_paths(head_dim);
        }
    }

    fn tree_nodes_attend_like_paths(head_dim: usize) {
        let h = Heads {
            heads: 4,
            kv_heads: 2,
            head_dim,
            scale: 0.2,
        };
        let past = 21;
        // Node j + 1's parent; deep enough to cross a key tile.
        let parents: Vec<u32> = vec![0, 1, 0, 2, 4, 3, 5, 6, 6, 8, 1, 10, 11];
        let nodes = parents.len() + 1;
        let value = |i: usize| ((i * 7919) % 1000) as f32 / 500.0 - 1.0;
        let kvw = h.kv_heads * h.head_dim;
        let key = |slot: usize| -> Vec<f32> { (0..kvw).map(|i| value(slot * 131 + i)).collect() };
        let val =
            |slot: usize| -> Vec<f32> { (0..kvw).map(|i| value(slot * 71 + i + 3)).collect() };
        let mut kv = KvBuffers::new(1, h.kv_heads, h.head_dim, 16);
        kv.grow(past + nodes, 0);
        for slot in 0..past + nodes {
            kv.write(0, slot, &key(slot), &val(slot));
        }
        let width = h.heads * h.head_dim;
        let q: Vec<f32> = (0..nodes * width).map(|i| value(i * 37 + 11)).collect();
        let pool = ThreadPool::new(2);
        let path_to = |node: usize| {
            let tree = UnitTree {
                parents: &parents,
                past,
                offset: 0,
            };
            let mut path = Vec::new();
            tree.path_into(node, &mut path);
            path
        };
        for isa in Isa::available() {
            let mut whole = vec![0f32; nodes * width];
            let span = Span {
                start: 0,
                len: nodes,
                past,
            };
            attend_trees(
                &q,
                &[span],
                &[&parents],
                &[&kv],
                0,
                h,
                &mut whole,
                &pool,
                isa,
            );
            // The last five nodes alone, the others already in the cache.
            let mut tail = vec![0f32; 5 * width];
            let span = Span {
                start: 0,
                len: 5,
                past: past + nodes - 5,
            };
            let q_tail = &q[(nodes - 5) * width..];
            attend_trees(
                q_tail,
                &[span],
                &[&parents],
                &[&kv],
                0,
                h,
                &mut tail,
                &pool,
                isa,
            );
            assert!(
                whole[(nodes - 5) * width..]
                    .iter()
                    .zip(&tail)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{} the tree's last nodes alone",
                isa.name()
            );
            for node in 0..nodes {
                let path = path_to(node);
                let mut alone_kv = KvBuffers::new(1, h.kv_heads, h.head_dim, past + nodes);
                for slot in 0..past {
                    alone_kv.write(0, slot, &key(slot), &val(slot));
                }
                for (k, &at) in path.iter().enumerate() {
                    alone_kv.write(0, past + k, &key(past + at), &val(past + at));
                }
                let mut alone = vec![0f32; width];
                let span = Span {
                    start: 0,
                    len: 1,
                    past: past + path.len() - 1,
                };
                let q_node = &q[node * width..(node + 1) * width];
                attend(
                    q_node,
                    &[span],
                    &[&alone_kv],
                    0,
                    h,
                    &mut alone,
                    &pool,
                    Isa::Portable,
                );
                assert!(
                    whole[node * width..(node + 1) * width]
                        .iter()
                        .zip(&alone)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} head_dim {head_dim} node {node} (path {path:?})",
                    isa.name()
                );
            }
        }
    }

    /// A block of tokens, against each token alone and a float reference.
    #[test]
    fn a_block_of_tokens_attends_like_each_token_alone() {
        // The generic path and the register-blocked weighted sums (64 and 128 dimensions).
        for head_dim in [32, 64, 128] {
            block_attends_like_each_token_alone(head_dim);
        }
    }

    fn block_attends_like_each_token_alone(head_dim: usize) {
        let h = Heads {
            heads: 4,
            kv_heads: 2,
            head_dim,
            scale: 0.2,
        };
        let (tokens, past) = (11, 5);
        let mut kv = KvBuffers::new(1, h.kv_heads, h.head_dim, 32);
        let value = |i: usize| ((i * 7919) % 1000) as f32 / 500.0 - 1.0;
        let kvw = h.kv_heads * h.head_dim;
        for pos in 0..past + tokens {
            let k: Vec<f32> = (0..kvw).map(|i| value(pos * 131 + i)).collect();
            let v: Vec<f32> = (0..kvw).map(|i| value(pos * 71 + i + 3)).collect();
            kv.write(0, pos, &k, &v);
        }
        let width = h.heads * h.head_dim;
        let q: Vec<f32> = (0..tokens * width).map(|i| value(i * 37 + 11)).collect();
        let pool = ThreadPool::new(2);
        for isa in Isa::available() {
            let mut block = vec![0f32; tokens * width];
            let span = Span {
                start: 0,
                len: tokens,
                past,
            };
            attend(&q, &[span], &[&kv], 0, h, &mut block, &pool, isa);
            for t in 0..tokens {
                let mut alone = vec![0f32; width];
                let span = Span {
                    start: 0,
                    len: 1,
                    past: past + t,
                };
                attend(
                    &q[t * width..(t + 1) * width],
                    &[span],
                    &[&kv],
                    0,
                    h,
                    &mut alone,
                    &pool,
                    Isa::Portable,
                );
                let got = &block[t * width..(t + 1) * width];
                assert!(
                    got.iter()
                        .zip(&alone)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} token {t}",
                    isa.name()
                );
                for head in 0..h.heads {
                    let kvh = head / (h.heads / h.kv_heads);
                    let (_, v) = kv.head(0, kvh, past + t + 1);
                    let qh = &q[t * width + head * h.head_dim..][..h.head_dim];
                    let key = |pos: usize, dim: usize| {
                        f64::from(value(pos * 131 + kvh * h.head_dim + dim))
                    };
                    let s: Vec<f64> = (0..past + t + 1)
                        .map(|pos| {
                            (0..h.head_dim)
                                .map(|dim| key(pos, dim) * f64::from(qh[dim]))
                                .sum::<f64>()
                                * f64::from(h.scale)
                        })
                        .collect();
                    let m = s.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for dim in 0..h.head_dim {
                        let r: f64 = e
                            .iter()
                            .zip(v.chunks(h.head_dim))
                            .map(|(p, vr)| p / z * vr[dim] as f64)
                            .sum();
                        let ours = got[head * h.head_dim + dim] as f64;
                        assert!(
                            (ours - r).abs() < 1e-5,
                            "token {t} head {head} dim {dim}: {ours} vs {r}"
                        );
                    }
                }
            }
        }
    }
}
