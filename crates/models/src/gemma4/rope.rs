//! Rotary embeddings of Gemma 4: default RoPE on sliding layers and "proportional" RoPE on
//! full layers, where only the first `partial_rotary_factor` of each half rotates and the
//! exponent still divides by the whole head dimension.

use candle_core::{DType, Device, Tensor};

use super::config::RopeConfig;
use crate::error::Result;

#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    pub fn new(cfg: &RopeConfig, head_dim: usize) -> Self {
        let half = head_dim / 2;
        let rotated = if cfg.proportional {
            ((cfg.partial_rotary_factor * head_dim as f64) as usize / 2).min(half)
        } else {
            half
        };
        // transformers computes these in f32; do the same so positions map to the same angles.
        let theta = cfg.theta as f32;
        let factor = cfg.factor as f32;
        let inv_freq = (0..half)
            .map(|i| {
                if i < rotated {
                    let exponent = (2 * i) as f32 / head_dim as f32;
                    (1.0 / theta.powf(exponent)) / factor
                } else {
                    0.0
                }
            })
            .collect();
        Self { inv_freq }
    }

    /// `cos`, `sin` of shape `[positions, head_dim / 2]`.
    pub fn cos_sin(
        &self,
        positions: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        let shape = (positions.len(), half);
        Ok((
            Tensor::from_vec(cos, shape, device)?.to_dtype(dtype)?,
            Tensor::from_vec(sin, shape, device)?.to_dtype(dtype)?,
        ))
    }
}

/// Rotates `x [t, heads, head_dim]` (non-interleaved halves).
pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let x4 = x.unsqueeze(0)?.contiguous()?;
    Ok(candle_nn::rotary_emb::rope_thd(&x4, cos, sin)?.squeeze(0)?)
}
