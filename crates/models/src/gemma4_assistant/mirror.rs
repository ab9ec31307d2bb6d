//! The drafter's copy of the target's shared K/V for one session.
//!
//! It starts from a whole snapshot (after prefill) and then takes, each round, only the rows
//! the round committed, so nothing sent to the drafter grows with the context. Full-attention
//! rows are kept for every committed position; sliding rows only as far back as the
//! assistant's query can see. Rows live in buffers with spare capacity, so appending a round
//! copies only the new rows.

use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};
use crate::gemma4::{LayerKv, SharedKv};

/// An append-only run of K/V rows `[kv_heads, capacity, head_dim]` of which the first `len`
/// are filled, for positions `start .. start + len`. Rows already handed out are never
/// written again: growing or compacting moves the rows to a fresh buffer.
struct KvBuffer {
    keys: Tensor,
    values: Tensor,
    start: usize,
    len: usize,
    /// Rows to keep when compacting (`None`: keep everything).
    keep: Option<usize>,
}

impl KvBuffer {
    fn new(rows: &LayerKv, keep: Option<usize>) -> Result<Self> {
        let (heads, n, dim) = rows.keys.dims3()?;
        let skip = keep.map_or(0, |k| n.saturating_sub(k));
        let capacity = Self::capacity_for(keep, n - skip, 0);
        let (dtype, device) = (rows.keys.dtype(), rows.keys.device());
        let mut buffer = Self {
            keys: Tensor::zeros((heads, capacity, dim), dtype, device)?,
            values: Tensor::zeros((heads, capacity, dim), dtype, device)?,
            start: rows.start + skip,
            len: 0,
            keep,
        };
        buffer.append(
            &rows.keys.narrow(1, skip, n - skip)?,
            &rows.values.narrow(1, skip, n - skip)?,
        )?;
        Ok(buffer)
    }

    /// Room for `rows` kept rows, `incoming` new ones, and as many again: a sliding buffer
    /// compacts once per `keep` appended rows, a full one doubles.
    fn capacity_for(keep: Option<usize>, rows: usize, incoming: usize) -> usize {
        match keep {
            Some(keep) => 2 * keep.max(rows) + incoming,
            None => (2 * (rows + incoming)).max(16),
        }
    }

    fn capacity(&self) -> usize {
        self.keys.dims()[1]
    }

    fn end(&self) -> usize {
        self.start + self.len
    }

    /// The rows worth keeping, `[heads, rows, dim]`, and their first position.
    fn view(&self) -> Result<LayerKv> {
        let drop = self.keep.map_or(0, |k| self.len.saturating_sub(k));
        Ok(LayerKv {
            keys: self.keys.narrow(1, drop, self.len - drop)?,
            values: self.values.narrow(1, drop, self.len - drop)?,
            start: self.start + drop,
        })
    }

    fn append(&mut self, keys: &Tensor, values: &Tensor) -> Result<()> {
        let n = keys.dims()[1];
        if n == 0 {
            return Ok(());
        }
        if self.len + n > self.capacity() {
            self.reallocate(n)?;
        }
        self.keys.slice_set(&keys.contiguous()?, 1, self.len)?;
        self.values.slice_set(&values.contiguous()?, 1, self.len)?;
        self.len += n;
        Ok(())
    }

    /// Moves the kept rows to a fresh buffer with room for `incoming` more.
    fn reallocate(&mut self, incoming: usize) -> Result<()> {
        let kept = self.view()?;
        let rows = kept.keys.dims()[1];
        let capacity = Self::capacity_for(self.keep, rows, incoming);
        let (heads, _, dim) = self.keys.dims3()?;
        let keys = Tensor::zeros(
            (heads, capacity, dim),
            self.keys.dtype(),
            self.keys.device(),
        )?;
        let values = Tensor::zeros(
            (heads, capacity, dim),
            self.keys.dtype(),
            self.keys.device(),
        )?;
        if rows > 0 {
            keys.slice_set(&kept.keys.contiguous()?, 1, 0)?;
            values.slice_set(&kept.values.contiguous()?, 1, 0)?;
        }
        *self = Self {
            keys,
            values,
            start: kept.start,
            len: rows,
            keep: self.keep,
        };
        Ok(())
    }
}

/// The drafter's view of one session's shared K/V and of how many tokens the target cache
/// has committed.
pub struct SharedKvMirror {
    full: KvBuffer,
    sliding: Option<KvBuffer>,
    sliding_keep: usize,
    committed_len: usize,
}

fn geometry(kv: &LayerKv, what: &str) -> Result<(usize, usize)> {
    let (heads, _, dim) = kv.keys.dims3().map_err(|_| {
        ModelError::Invalid(format!(
            "{what}.keys: expected [heads, rows, dim], got {:?}",
            kv.keys.dims()
        ))
    })?;
    if kv.values.dims() != kv.keys.dims() {
        return Err(ModelError::Invalid(format!(
            "{what}.values: shape {:?} differs from the keys' {:?}",
            kv.values.dims(),
            kv.keys.dims()
        )));
    }
    Ok((heads, dim))
}

fn converted(kv: &LayerKv, dtype: DType, device: &Device) -> Result<LayerKv> {
    Ok(LayerKv {
        keys: kv.keys.to_dtype(dtype)?.to_device(device)?,
        values: kv.values.to_dtype(dtype)?.to_device(device)?,
        start: kv.start,
    })
}

impl SharedKvMirror {
    /// Builds the mirror from a snapshot of every committed position (the sliding rows may
    /// start later, but must include the last `sliding_keep` positions). Rows are stored in
    /// `dtype` on `device`.
    pub fn from_snapshot(
        snapshot: &SharedKv,
        sliding_keep: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let sliding_keep = sliding_keep.max(1);
        geometry(&snapshot.full, "snapshot.full")?;
        if snapshot.full.start != 0 {
            return Err(ModelError::Invalid(format!(
                "snapshot.full.start: full-attention rows must start at position 0, got {}",
                snapshot.full.start
            )));
        }
        let committed_len = snapshot.full.end();
        if committed_len == 0 {
            return Err(ModelError::Invalid(
                "snapshot.full: holds no positions".into(),
            ));
        }
        let sliding = match &snapshot.sliding {
            Some(rows) => {
                geometry(rows, "snapshot.sliding")?;
                if rows.end() != committed_len {
                    return Err(ModelError::Invalid(format!(
                        "snapshot.sliding: ends at position {} but the full-attention rows end at {committed_len}",
                        rows.end()
                    )));
                }
                let needed = committed_len.saturating_sub(sliding_keep);
                if rows.start > needed {
                    return Err(ModelError::Invalid(format!(
                        "snapshot.sliding.start: rows start at position {} but the drafter needs them from {needed} \
                         (the last {sliding_keep} positions)",
                        rows.start
                    )));
                }
                Some(KvBuffer::new(
                    &converted(rows, dtype, device)?,
                    Some(sliding_keep),
                )?)
            }
            None => None,
        };
        Ok(Self {
            full: KvBuffer::new(&converted(&snapshot.full, dtype, device)?, None)?,
            sliding,
            sliding_keep,
            committed_len,
        })
    }

    /// Appends the rows one round committed, positions `committed_len .. committed_len + n`.
    pub fn apply_delta(&mut self, delta: &SharedKv) -> Result<()> {
        let at = self.committed_len;
        self.check_rows(&delta.full, "delta.full", self.full.keys.dims())?;
        let n = delta.full.rows();
        let sliding_dims = self.sliding.as_ref().map(|s| s.keys.dims().to_vec());
        match (sliding_dims, &delta.sliding) {
            (Some(dims), Some(rows)) => {
                self.check_rows(rows, "delta.sliding", &dims)?;
                if rows.rows() != n {
                    return Err(ModelError::Invalid(format!(
                        "delta.sliding: holds {} positions but delta.full holds {n}",
                        rows.rows()
                    )));
                }
            }
            (None, None) => {}
            (Some(_), None) => return Err(ModelError::Invalid("delta.sliding: missing".into())),
            (None, Some(_)) => {
                return Err(ModelError::Invalid(
                    "delta.sliding: the snapshot had no sliding rows".into(),
                ))
            }
        }
        let (dtype, device) = (self.full.keys.dtype(), self.full.keys.device().clone());
        let full = converted(&delta.full, dtype, &device)?;
        self.full.append(&full.keys, &full.values)?;
        if let (Some(buffer), Some(rows)) = (&mut self.sliding, &delta.sliding) {
            let rows = converted(rows, dtype, &device)?;
            buffer.append(&rows.keys, &rows.values)?;
        }
        self.committed_len = at + n;
        debug_assert_eq!(self.full.end(), self.committed_len);
        Ok(())
    }

    fn check_rows(&self, rows: &LayerKv, what: &str, dims: &[usize]) -> Result<()> {
        let (heads, dim) = geometry(rows, what)?;
        if dims.len() != 3 || heads != dims[0] || dim != dims[2] {
            return Err(ModelError::Invalid(format!(
                "{what}: rows of {heads} heads x {dim} dims do not fit the mirror's {dims:?}"
            )));
        }
        if rows.start != self.committed_len {
            return Err(ModelError::Invalid(format!(
                "{what}.start: the rows start at position {} but the mirror holds {} committed positions",
                rows.start, self.committed_len
            )));
        }
        Ok(())
    }

    /// Tokens in the target cache; the drafter's query sits at `committed_len - 1`.
    pub fn committed_len(&self) -> usize {
        self.committed_len
    }

    /// Every committed position's full-attention K/V.
    pub fn full(&self) -> Result<LayerKv> {
        self.full.view()
    }

    /// The last `sliding_keep` committed positions' sliding K/V, if the target has sliding layers.
    pub fn sliding(&self) -> Result<Option<LayerKv>> {
        self.sliding.as_ref().map(KvBuffer::view).transpose()
    }

    pub fn sliding_keep(&self) -> usize {
        self.sliding_keep
    }

    /// Bytes held by the buffers (spare capacity included).
    pub fn bytes(&self) -> usize {
        let size = |b: &KvBuffer| 2 * b.keys.elem_count() * b.keys.dtype().size_in_bytes();
        size(&self.full) + self.sliding.as_ref().map_or(0, size)
    }
}
