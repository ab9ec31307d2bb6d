//! Rotary position embedding (NeoX layout: the two halves of each head are rotated together).
//!
//! Angles are computed per token from its absolute position, so every row of a batch can sit
//! at its own position and a token's rotation never depends on the block it arrived in.

use candle_core::{Device, Tensor};

use super::super::error::Result;

pub struct RotaryEmbedding {
    inv_freq: Vec<f64>,
}

impl RotaryEmbedding {
    /// `inv_freq`: the angle per position of each rotated pair ([`Qwen2Config::inv_freq`]).
    ///
    /// [`Qwen2Config::inv_freq`]: super::super::config::Qwen2Config::inv_freq
    pub fn new(inv_freq: Vec<f64>) -> Self {
        Self { inv_freq }
    }

    /// `cos` and `sin`, each `[positions.len(), head_dim / 2]`.
    pub fn cos_sin(&self, positions: &[usize], device: &Device) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &pos in positions {
            for &f in &self.inv_freq {
                let angle = pos as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        let shape = (positions.len(), half);
        Ok((
            Tensor::from_vec(cos, shape, device)?,
            Tensor::from_vec(sin, shape, device)?,
        ))
    }
}
