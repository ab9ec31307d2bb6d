//! The per-sequence KV cache.
//!
//! K and V of every layer are kept as `[kv_heads, capacity, head_dim]` f32 buffers written
//! in place (host memory for the CPU engine, device memory otherwise); only the first `len`
//! positions are valid. Rolling back after a rejected draft is `truncate(len)`: the stale
//! positions are simply overwritten by the next block. The buffers are mutated in place, so
//! the cache is deliberately not `Clone`.

use candle_core::Device;

use super::candle::DeviceKv;
use super::error::{Qwen2Error, Result};
use crate::cpu::KvBuffers;

/// Positions allocated for a new cache before it first grows.
const INITIAL_CAPACITY: usize = 256;

pub(crate) enum KvStore {
    Host(KvBuffers),
    Device(DeviceKv),
}

pub struct KvCache {
    pub(crate) store: KvStore,
    len: usize,
    capacity: usize,
    num_layers: usize,
    kv_heads: usize,
    head_dim: usize,
    max_len: usize,
}

impl KvCache {
    /// A cache in host memory (`device` `None`, for the CPU engine) or on a candle device.
    pub(crate) fn new(
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        max_len: usize,
        device: Option<&Device>,
    ) -> Result<Self> {
        let capacity = INITIAL_CAPACITY.min(max_len);
        let store = match device {
            None => KvStore::Host(KvBuffers::new(num_layers, kv_heads, head_dim, capacity)),
            Some(device) => KvStore::Device(DeviceKv::new(
                num_layers, kv_heads, head_dim, capacity, device,
            )?),
        };
        Ok(Self {
            store,
            len: 0,
            capacity,
            num_layers,
            kv_heads,
            head_dim,
            max_len,
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
        2 * self.num_layers * self.kv_heads * self.capacity * self.head_dim * 4
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

    /// Makes this cache hold the first `len` positions of `source`, whose first `shared`
    /// positions it already holds. `Ok(false)` for caches on a candle device, which are not
    /// copied.
    pub(crate) fn copy_prefix(
        &mut self,
        source: &KvCache,
        shared: usize,
        len: usize,
    ) -> Result<bool> {
        let same_shape = (self.num_layers, self.kv_heads, self.head_dim)
            == (source.num_layers, source.kv_heads, source.head_dim);
        if !same_shape || len > source.len {
            return Err(Qwen2Error::CacheMismatch {
                row: 0,
                message: format!(
                    "copying {len} positions of a cache holding {} (of another shape: {})",
                    source.len, !same_shape
                ),
            });
        }
        if !matches!(
            (&self.store, &source.store),
            (KvStore::Host(_), KvStore::Host(_))
        ) {
            return Ok(false);
        }
        let shared = shared.min(self.len).min(len);
        self.reserve(len)?;
        if let (KvStore::Host(target), KvStore::Host(from)) = (&mut self.store, &source.store) {
            target.copy_positions(from, shared, len);
        }
        self.len = len;
        Ok(true)
    }

    /// Forgets every position; the buffers are kept for reuse.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Checks that this cache was built for a model with these dimensions whose caches live
    /// in host memory (`device` `None`, the CPU engine) or on `device` (candle).
    pub(crate) fn check_fits(
        &self,
        row: usize,
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        device: Option<&Device>,
    ) -> Result<()> {
        let mismatch = |message: String| Err(Qwen2Error::CacheMismatch { row, message });
        if self.num_layers != num_layers {
            return mismatch(format!(
                "{} layers, the model has {num_layers}",
                self.num_layers
            ));
        }
        if self.kv_heads != kv_heads || self.head_dim != head_dim {
            return mismatch(format!(
                "{} KV heads of size {}, the model has {kv_heads} of size {head_dim}",
                self.kv_heads, self.head_dim
            ));
        }
        match (&self.store, device) {
            (KvStore::Host(_), None) => Ok(()),
            (KvStore::Device(kv), Some(device)) if kv.device().same_device(device) => Ok(()),
            (_, Some(device)) => mismatch(format!(
                "cache and model are on different devices or backends (model on candle, {:?})",
                device.location()
            )),
            (KvStore::Device(_), None) => {
                mismatch("a candle cache given to the CPU engine".to_string())
            }
        }
    }

    /// Makes room for `needed` positions, growing geometrically up to the context length.
    pub(crate) fn reserve(&mut self, needed: usize) -> Result<()> {
        if needed <= self.capacity {
            return Ok(());
        }
        let capacity = needed.max(self.capacity * 2).min(self.max_len.max(needed));
        match &mut self.store {
            KvStore::Host(kv) => kv.grow(capacity, self.len),
            KvStore::Device(kv) => kv.grow(capacity, self.len)?,
        }
        self.capacity = capacity;
        Ok(())
    }

    /// Marks `n` more positions valid once every layer holds them.
    /// Keeps the nodes `path` of a tree block that started at `start` (root first) as the
    /// positions after `start`, in path order, and drops every other node.
    pub(crate) fn keep_path(&mut self, start: usize, path: &[usize]) -> Result<()> {
        crate::tree::check_path(start, path, self.len)
            .map_err(|message| Qwen2Error::Tree { row: 0, message })?;
        match &mut self.store {
            KvStore::Host(kv) => {
                for (k, &node) in path.iter().enumerate() {
                    kv.move_position(start + node, start + k);
                }
            }
            KvStore::Device(kv) => kv.keep_path(start, path)?,
        }
        self.len = start + path.len();
        Ok(())
    }

    pub(crate) fn commit(&mut self, n: usize) {
        self.len += n;
    }
}
