//! The per-sequence KV cache.
//!
//! Each layer keeps K and V as `[kv_heads, capacity, head_dim]` buffers that are written in
//! place; only the first `len` positions are valid. Rolling back after a rejected draft is
//! `truncate(len)`: the stale positions are simply overwritten by the next block. The buffers
//! are mutated in place, so the cache is deliberately not `Clone`.

use candle_core::{DType, Device, Tensor};

use super::error::{Qwen2Error, Result};

/// Positions allocated for a new cache before it first grows.
const INITIAL_CAPACITY: usize = 256;

pub(crate) struct LayerKv {
    pub(crate) k: Tensor,
    pub(crate) v: Tensor,
}

pub struct KvCache {
    layers: Vec<LayerKv>,
    len: usize,
    capacity: usize,
    kv_heads: usize,
    head_dim: usize,
    max_len: usize,
    device: Device,
}

impl KvCache {
    pub(crate) fn new(
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        max_len: usize,
        device: &Device,
    ) -> Result<Self> {
        let capacity = INITIAL_CAPACITY.min(max_len);
        let layers = (0..num_layers)
            .map(|_| Self::alloc(kv_heads, capacity, head_dim, device))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layers,
            len: 0,
            capacity,
            kv_heads,
            head_dim,
            max_len,
            device: device.clone(),
        })
    }

    fn alloc(
        kv_heads: usize,
        capacity: usize,
        head_dim: usize,
        device: &Device,
    ) -> Result<LayerKv> {
        let shape = (kv_heads, capacity, head_dim);
        Ok(LayerKv {
            k: Tensor::zeros(shape, DType::F32, device)?,
            v: Tensor::zeros(shape, DType::F32, device)?,
        })
    }

    /// Number of committed positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions that fit before the buffers must grow.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes held by the K and V buffers (their capacity, not just the valid positions).
    pub fn allocated_bytes(&self) -> usize {
        2 * self.layers.len()
            * self.kv_heads
            * self.capacity
            * self.head_dim
            * std::mem::size_of::<f32>()
    }

    /// Keeps the first `len` positions and forgets the rest (rollback after a rejection).
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(Qwen2Error::TruncateBeyondLength {
                requested: len,
                len: self.len,
            });
        }
        self.len = len;
        Ok(())
    }

    /// Forgets every position; the buffers are kept for reuse.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Checks that this cache was built for a model with these dimensions.
    pub(crate) fn check_fits(
        &self,
        row: usize,
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        device: &Device,
    ) -> Result<()> {
        let mismatch = |message: String| Err(Qwen2Error::CacheMismatch { row, message });
        if self.layers.len() != num_layers {
            return mismatch(format!(
                "{} layers, the model has {num_layers}",
                self.layers.len()
            ));
        }
        if self.kv_heads != kv_heads || self.head_dim != head_dim {
            return mismatch(format!(
                "{} KV heads of size {}, the model has {kv_heads} of size {head_dim}",
                self.kv_heads, self.head_dim
            ));
        }
        if !self.device.same_device(device) {
            return mismatch(format!(
                "cache on {:?}, model on {:?}",
                self.device.location(),
                device.location()
            ));
        }
        Ok(())
    }

    /// Makes room for `needed` positions, growing geometrically up to the context length.
    pub(crate) fn reserve(&mut self, needed: usize) -> Result<()> {
        if needed <= self.capacity {
            return Ok(());
        }
        let capacity = needed.max(self.capacity * 2).min(self.max_len.max(needed));
        for layer in &mut self.layers {
            let grown = Self::alloc(self.kv_heads, capacity, self.head_dim, &self.device)?;
            if self.len > 0 {
                grown
                    .k
                    .slice_set(&layer.k.narrow(1, 0, self.len)?.contiguous()?, 1, 0)?;
                grown
                    .v
                    .slice_set(&layer.v.narrow(1, 0, self.len)?.contiguous()?, 1, 0)?;
            }
            *layer = grown;
        }
        self.capacity = capacity;
        Ok(())
    }

    /// Writes `k`, `v` `[n, kv_heads, head_dim]` at positions `at..at + n` of one layer.
    pub(crate) fn write(&self, layer: usize, at: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let kv = &self.layers[layer];
        kv.k.slice_set(&k.transpose(0, 1)?.contiguous()?, 1, at)?;
        kv.v.slice_set(&v.transpose(0, 1)?.contiguous()?, 1, at)?;
        Ok(())
    }

    pub(crate) fn layer(&self, layer: usize) -> &LayerKv {
        &self.layers[layer]
    }

    /// Marks `n` more positions valid once every layer holds them.
    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }
}
