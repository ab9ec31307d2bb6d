//! K/V of one sequence on a candle device: per layer `[kv_heads, capacity, head_dim]` f32
//! buffers written in place.

use candle_core::{DType, Device, Tensor};

use super::super::error::Result;

pub(crate) struct DeviceKv {
    layers: Vec<(Tensor, Tensor)>,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    device: Device,
}

impl DeviceKv {
    pub(crate) fn new(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        device: &Device,
    ) -> Result<Self> {
        let layers = (0..layers)
            .map(|_| Self::alloc(kv_heads, capacity, head_dim, device))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layers,
            kv_heads,
            head_dim,
            capacity,
            device: device.clone(),
        })
    }

    fn alloc(
        kv_heads: usize,
        capacity: usize,
        head_dim: usize,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let shape = (kv_heads, capacity, head_dim);
        Ok((
            Tensor::zeros(shape, DType::F32, device)?,
            Tensor::zeros(shape, DType::F32, device)?,
        ))
    }

    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// Grows to `capacity` positions, keeping the first `keep`.
    pub(crate) fn grow(&mut self, capacity: usize, keep: usize) -> Result<()> {
        if capacity <= self.capacity {
            return Ok(());
        }
        for layer in &mut self.layers {
            let grown = Self::alloc(self.kv_heads, capacity, self.head_dim, &self.device)?;
            if keep > 0 {
                grown
                    .0
                    .slice_set(&layer.0.narrow(1, 0, keep)?.contiguous()?, 1, 0)?;
                grown
                    .1
                    .slice_set(&layer.1.narrow(1, 0, keep)?.contiguous()?, 1, 0)?;
            }
            *layer = grown;
        }
        self.capacity = capacity;
        Ok(())
    }

    /// Writes `k`, `v` `[n, kv_heads, head_dim]` at positions `at..at + n` of one layer.
    pub(crate) fn write(&self, layer: usize, at: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let (kb, vb) = &self.layers[layer];
        kb.slice_set(&k.transpose(0, 1)?.contiguous()?, 1, at)?;
        vb.slice_set(&v.transpose(0, 1)?.contiguous()?, 1, at)?;
        Ok(())
    }

    /// Moves the rows of slots `start + path[k]` to `start + k` in every layer (a tree's
    /// kept path; `path` ascends and `path[k] >= k`).
    pub(crate) fn keep_path(&self, start: usize, path: &[usize]) -> Result<()> {
        if path.is_empty() {
            return Ok(());
        }
        let rows: Vec<u32> = path.iter().map(|&node| (start + node) as u32).collect();
        let index = Tensor::new(rows.as_slice(), &self.device)?;
        for (k, v) in &self.layers {
            // Gathered first, so no row is overwritten before it moves.
            let (kept_k, kept_v) = (k.index_select(&index, 1)?, v.index_select(&index, 1)?);
            k.slice_set(&kept_k, 1, start)?;
            v.slice_set(&kept_v, 1, start)?;
        }
        Ok(())
    }

    pub(crate) fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }
}
