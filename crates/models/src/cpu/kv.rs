//! A sequence's K/V in host memory: per layer, K and V as `[kv_heads, capacity, head_dim]`
//! f32, written in place; growing copies the valid positions into larger buffers.

/// K/V buffers of one sequence.
pub struct KvBuffers {
    layers: Vec<(Vec<f32>, Vec<f32>)>,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
}

impl KvBuffers {
    pub fn new(layers: usize, kv_heads: usize, head_dim: usize, capacity: usize) -> Self {
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

    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn bytes(&self) -> usize {
        2 * self.layers.len() * self.kv_heads * self.capacity * self.head_dim * 4
    }

    /// Grows every layer to `capacity` positions, keeping the first `keep`.
    pub fn grow(&mut self, capacity: usize, keep: usize) {
        if capacity <= self.capacity {
            return;
        }
        let (heads, dim, old) = (self.kv_heads, self.head_dim, self.capacity);
        for (k, v) in &mut self.layers {
            for buf in [k, v] {
                let mut grown = vec![0.0; heads * capacity * dim];
                for h in 0..heads {
                    let from = &buf[h * old * dim..(h * old + keep) * dim];
                    grown[h * capacity * dim..(h * capacity + keep) * dim].copy_from_slice(from);
                }
                *buf = grown;
            }
        }
        self.capacity = capacity;
    }

    /// Writes one position's K and V (`[kv_heads * head_dim]` each) of one layer.
    pub fn write(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let (cap, dim) = (self.capacity, self.head_dim);
        let (kb, vb) = &mut self.layers[layer];
        for h in 0..self.kv_heads {
            let at = (h * cap + pos) * dim;
            kb[at..at + dim].copy_from_slice(&k[h * dim..(h + 1) * dim]);
            vb[at..at + dim].copy_from_slice(&v[h * dim..(h + 1) * dim]);
        }
    }

    /// K and V rows `0..len` of one head of one layer, each `[len, head_dim]`.
    pub fn head(&self, layer: usize, head: usize, len: usize) -> (&[f32], &[f32]) {
        let (cap, dim) = (self.capacity, self.head_dim);
        let (k, v) = &self.layers[layer];
        let at = head * cap * dim;
        (&k[at..at + len * dim], &v[at..at + len * dim])
    }
}
