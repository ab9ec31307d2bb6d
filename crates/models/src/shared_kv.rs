//! The K/V rows a target shares with a drafter, in the model's layout: any family whose
//! drafter reads the target's K/V (Gemma 4's MTP assistant today) exports them as these.

use candle_core::Tensor;

use crate::error::{ModelError, Result};

/// Rows of one layer: keys and values `[kv_heads, rows, head_dim]` for positions
/// `start .. start + rows`.
#[derive(Debug, Clone)]
pub struct LayerKv {
    pub keys: Tensor,
    pub values: Tensor,
    pub start: usize,
}

impl LayerKv {
    pub fn rows(&self) -> usize {
        self.keys.dims()[1]
    }

    pub fn end(&self) -> usize {
        self.start + self.rows()
    }

    /// The rows of positions `from .. to`, which must be held.
    pub fn range(&self, from: usize, to: usize) -> Result<LayerKv> {
        if from < self.start || to > self.end() || from > to {
            return Err(ModelError::Invalid(format!(
                "positions {from}..{to} are not held (cache holds {}..{})",
                self.start,
                self.end()
            )));
        }
        Ok(LayerKv {
            keys: self.keys.narrow(1, from - self.start, to - from)?,
            values: self.values.narrow(1, from - self.start, to - from)?,
            start: from,
        })
    }

    /// The rows before position `at`, then the rows of positions `at + node` for each of
    /// `nodes` in order (a tree's kept path).
    pub fn keep_rows(&self, at: usize, nodes: &[usize]) -> Result<LayerKv> {
        if at < self.start || nodes.iter().any(|&n| at + n >= self.end()) {
            return Err(ModelError::Invalid(format!(
                "positions {at} + {nodes:?} are not held (cache holds {}..{})",
                self.start,
                self.end()
            )));
        }
        let before = at - self.start;
        let rows: Vec<u32> = (0..before)
            .chain(nodes.iter().map(|&n| before + n))
            .map(|row| row as u32)
            .collect();
        if rows.is_empty() {
            return self.range(self.start, self.start);
        }
        let index = Tensor::new(rows.as_slice(), self.keys.device())?;
        Ok(LayerKv {
            keys: self.keys.index_select(&index, 1)?,
            values: self.values.index_select(&index, 1)?,
            start: self.start,
        })
    }
}

/// The K/V a drafter needs: the last full-attention and the last sliding layer that compute
/// their own K/V (post-norm, post-RoPE).
#[derive(Debug, Clone)]
pub struct SharedKv {
    pub full: LayerKv,
    pub sliding: Option<LayerKv>,
}
