//! A sequence's K/V in host memory, written in place; growing copies the valid positions
//! into larger buffers.
//!
//! V is kept as `[kv_heads, capacity, head_dim]`. K is kept in tiles of [`KEY_TILE`] keys,
//! `[kv_heads, capacity / 16, head_dim, 16]`, so that attention computes the scores of 16
//! keys with one vector multiply-add per dimension and no horizontal reduction.

/// Keys side by side in one K tile.
pub const KEY_TILE: usize = 16;

/// K/V buffers of one sequence.
pub struct KvBuffers {
    layers: Vec<(Vec<f32>, Vec<f32>)>,
    kv_heads: usize,
    head_dim: usize,
    /// A multiple of [`KEY_TILE`].
    capacity: usize,
}

impl AsRef<KvBuffers> for KvBuffers {
    fn as_ref(&self) -> &KvBuffers {
        self
    }
}

impl KvBuffers {
    pub fn new(layers: usize, kv_heads: usize, head_dim: usize, capacity: usize) -> Self {
        let capacity = capacity.next_multiple_of(KEY_TILE);
        let size = kv_heads * capacity * head_dim;
        Self {
            layers: (0..layers)
                .map(|_| (vec![0.0; size], vec![0.0; size]))
                .collect(),
            kv_heads,
            head_dim,
            capacity,
        }
    }

    /// Grows every layer to at least `capacity` positions, keeping the first `keep`.
    pub fn grow(&mut self, capacity: usize, keep: usize) {
        let capacity = capacity.next_multiple_of(KEY_TILE);
        if capacity <= self.capacity {
            return;
        }
        let (heads, dim, old) = (self.kv_heads, self.head_dim, self.capacity);
        // Both layouts keep one head's positions contiguous and in order (K by whole tiles).
        let kept_k = keep.next_multiple_of(KEY_TILE) * dim;
        for (k, v) in &mut self.layers {
            for (buf, kept) in [(k, kept_k), (v, keep * dim)] {
                let mut grown = vec![0.0; heads * capacity * dim];
                for h in 0..heads {
                    let from = &buf[h * old * dim..h * old * dim + kept];
                    grown[h * capacity * dim..h * capacity * dim + kept].copy_from_slice(from);
                }
                *buf = grown;
            }
        }
        self.capacity = capacity;
    }

    /// Copies positions `from..to` of every layer from `source` (the same dimensions; its
    /// capacity may differ). The first K tile is copied whole: its lanes before `from` are
    /// the ones this buffer shares with `source`.
    pub fn copy_positions(&mut self, source: &KvBuffers, from: usize, to: usize) {
        assert_eq!(
            (self.kv_heads, self.head_dim),
            (source.kv_heads, source.head_dim)
        );
        assert_eq!(self.layers.len(), source.layers.len());
        assert!(to <= self.capacity && to <= source.capacity && from <= to);
        if from == to {
            return;
        }
        let dim = self.head_dim;
        let (tiles, dst_cap, src_cap) = (
            from / KEY_TILE..to.div_ceil(KEY_TILE),
            self.capacity,
            source.capacity,
        );
        for ((k, v), (sk, sv)) in self.layers.iter_mut().zip(&source.layers) {
            for h in 0..self.kv_heads {
                let (dst, src) = (h * dst_cap * dim, h * src_cap * dim);
                let span = tiles.start * KEY_TILE * dim..tiles.end * KEY_TILE * dim;
                k[dst + span.start..dst + span.end]
                    .copy_from_slice(&sk[src + span.start..src + span.end]);
                v[dst + from * dim..dst + to * dim]
                    .copy_from_slice(&sv[src + from * dim..src + to * dim]);
            }
        }
    }

    /// Writes one position's K and V (`[kv_heads * head_dim]` each) of one layer.
    pub fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let (cap, dim) = (self.capacity, self.head_dim);
        let (kb, vb) = &mut self.layers[layer];
        let (tile, lane) = (pos / KEY_TILE, pos % KEY_TILE);
        for h in 0..self.kv_heads {
            let tile_at = (h * cap / KEY_TILE + tile) * dim * KEY_TILE;
            for (d, value) in k[h * dim..(h + 1) * dim].iter().enumerate() {
                kb[tile_at + d * KEY_TILE + lane] = *value;
            }
            let at = (h * cap + pos) * dim;
            vb[at..at + dim].copy_from_slice(&v[h * dim..(h + 1) * dim]);
        }
    }

    /// Moves position `from`'s K and V to position `to` in every layer (a tree's accepted
    /// node moved to where its depth puts it).
    pub fn move_position(&mut self, from: usize, to: usize) {
        assert!(from < self.capacity && to < self.capacity);
        if from == to {
            return;
        }
        let (cap, dim) = (self.capacity, self.head_dim);
        for (kb, vb) in &mut self.layers {
            for h in 0..self.kv_heads {
                let tile_of = |pos: usize| (h * cap / KEY_TILE + pos / KEY_TILE) * dim * KEY_TILE;
                let (src, dst) = (tile_of(from) + from % KEY_TILE, tile_of(to) + to % KEY_TILE);
                for d in 0..dim {
                    kb[dst + d * KEY_TILE] = kb[src + d * KEY_TILE];
                }
                let (src, dst) = ((h * cap + from) * dim, (h * cap + to) * dim);
                vb.copy_within(src..src + dim, dst);
            }
        }
    }

    /// One head of one layer over positions `0..len`: the K tiles that hold them
    /// (`[ceil(len / 16), head_dim, 16]`; lanes past `len` hold stale values) and the V rows
    /// (`[len, head_dim]`).
    pub fn head(&self, layer: usize, head: usize, len: usize) -> (&[f32], &[f32]) {
        let (cap, dim) = (self.capacity, self.head_dim);
        let (k, v) = &self.layers[layer];
        let at = head * cap * dim;
        let tiles = len.div_ceil(KEY_TILE);
        (&k[at..at + tiles * KEY_TILE * dim], &v[at..at + len * dim])
    }
}
