//! Per-sequence K/V caches built for speculative decoding.
//!
//! Full-attention layers keep every position. Sliding layers keep the last `window - 1`
//! positions a next query can see plus `max_rollback` positions of slack, so a rejected
//! verify block can be rolled back even after the window has wrapped. Rollback is a plain
//! truncation: rows are stored in temporal order, never as a ring.

use candle_core::Tensor;

use super::config::{Gemma4TextConfig, LayerKind};
use crate::error::{ModelError, Result};
use crate::shared_kv::LayerKv;

#[derive(Debug, Clone)]
pub struct SequenceCache {
    layers: Vec<Option<LayerKv>>,
    kinds: Vec<LayerKind>,
    owns_kv: Vec<bool>,
    len: usize,
    window: usize,
    max_rollback: usize,
}

impl SequenceCache {
    pub fn new(cfg: &Gemma4TextConfig, max_rollback: usize) -> Self {
        Self {
            layers: vec![None; cfg.num_layers],
            kinds: cfg.layers.iter().map(|l| l.kind).collect(),
            owns_kv: cfg
                .layers
                .iter()
                .enumerate()
                .map(|(i, l)| l.kv_source == i)
                .collect(),
            len: 0,
            window: cfg.sliding_window,
            max_rollback,
        }
    }

    /// Tokens in the cache.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn max_rollback(&self) -> usize {
        self.max_rollback
    }

    pub fn layer(&self, i: usize) -> Option<&LayerKv> {
        self.layers.get(i).and_then(Option::as_ref)
    }

    /// Appends the rows of a new block to layer `i`.
    pub(crate) fn append(&mut self, i: usize, keys: Tensor, values: Tensor) -> Result<()> {
        let slot = &mut self.layers[i];
        *slot = Some(match slot.take() {
            None => LayerKv {
                keys,
                values,
                start: self.len,
            },
            Some(old) => LayerKv {
                keys: Tensor::cat(&[&old.keys, &keys], 1)?,
                values: Tensor::cat(&[&old.values, &values], 1)?,
                start: old.start,
            },
        });
        Ok(())
    }

    /// Records that a forward of `tokens` positions finished and, with `trim`, drops sliding
    /// rows that no future query nor a rollback of up to `max_rollback` tokens can need.
    pub(crate) fn advance(&mut self, tokens: usize, trim: bool) -> Result<()> {
        self.len += tokens;
        if trim {
            self.trim()?;
        }
        Ok(())
    }

    /// Drops sliding rows that no future query nor a rollback of up to `max_rollback`
    /// tokens can need.
    fn trim(&mut self) -> Result<()> {
        let keep = (self.window.saturating_sub(1) + self.max_rollback).max(1);
        for (i, slot) in self.layers.iter_mut().enumerate() {
            if self.kinds[i] != LayerKind::Sliding {
                continue;
            }
            if let Some(kv) = slot {
                if kv.rows() > keep {
                    *kv = kv.range(kv.end() - keep, kv.end())?;
                }
            }
        }
        Ok(())
    }

    /// Rolls the sequence back to its first `len` tokens.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(ModelError::Invalid(format!(
                "cannot truncate a sequence of {} tokens to {len}",
                self.len
            )));
        }
        if len == self.len {
            return Ok(());
        }
        if len == 0 {
            self.layers.iter_mut().for_each(|slot| *slot = None);
            self.len = 0;
            return Ok(());
        }
        let need = self.window.saturating_sub(1).min(len);
        for (i, slot) in self.layers.iter_mut().enumerate() {
            let Some(kv) = slot else { continue };
            if self.kinds[i] == LayerKind::Sliding && kv.start > len - need {
                return Err(ModelError::Invalid(format!(
                    "cannot roll back to {len} tokens: the sliding window keeps positions from {} (rollback is limited to {} tokens)",
                    kv.start, self.max_rollback
                )));
            }
        }
        for slot in self.layers.iter_mut() {
            if let Some(kv) = slot.take() {
                if len > kv.start {
                    *slot = Some(kv.range(kv.start, len)?);
                }
            }
        }
        self.len = len;
        Ok(())
    }

    /// After a tree block whose root is in slot `start`, keeps the nodes of `path` (root
    /// first, each the parent of the next) as positions `start..start + path.len()` and drops
    /// every other node, leaving the rows a chain of the path alone would have left.
    pub fn keep_path(&mut self, start: usize, path: &[usize]) -> Result<()> {
        crate::tree::check_path(start, path, self.len).map_err(ModelError::Invalid)?;
        if let Some(kv) = self.layers.iter().flatten().find(|kv| kv.start > start) {
            return Err(ModelError::Invalid(format!(
                "the tree's root at {start} is no longer held (rows from {})",
                kv.start
            )));
        }
        for slot in self.layers.iter_mut() {
            let Some(kv) = slot.take() else { continue };
            *slot = Some(kv.keep_rows(start, path)?);
        }
        self.len = start + path.len();
        self.trim()
    }

    /// A cache of this sequence's first `len` positions holding exactly the rows a cold
    /// prefill of them leaves (every row of a full layer; a sliding layer's last
    /// `window - 1 + max_rollback`), as views of this cache's tensors; `None` when a
    /// sliding layer no longer holds a row that prefill would keep.
    pub fn prefix(&self, len: usize) -> Result<Option<Self>> {
        if len > self.len {
            return Ok(None);
        }
        let keep = (self.window.saturating_sub(1) + self.max_rollback).max(1);
        let mut layers = Vec::with_capacity(self.layers.len());
        for (i, slot) in self.layers.iter().enumerate() {
            let Some(kv) = slot else {
                layers.push(None);
                continue;
            };
            let from = match self.kinds[i] {
                LayerKind::Sliding => len.saturating_sub(keep),
                _ => 0,
            };
            if kv.start > from {
                return Ok(None);
            }
            layers.push((len > from).then(|| kv.range(from, len)).transpose()?);
        }
        Ok(Some(Self {
            layers,
            len,
            ..self.clone_shape()
        }))
    }

    /// This cache's shape with no rows.
    fn clone_shape(&self) -> Self {
        Self {
            layers: vec![None; self.layers.len()],
            kinds: self.kinds.clone(),
            owns_kv: self.owns_kv.clone(),
            len: 0,
            window: self.window,
            max_rollback: self.max_rollback,
        }
    }

    /// Whether layer `i` holds its own K/V (false for KV-shared layers).
    pub fn owns_kv(&self, i: usize) -> bool {
        self.owns_kv[i]
    }

    /// Bytes held by keys and values.
    pub fn kv_bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|kv| 2 * kv.keys.elem_count() * kv.keys.dtype().size_in_bytes())
            .sum()
    }
}
