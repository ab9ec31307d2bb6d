//! Gemma 4 RMSNorm: `x * (mean(x^2) + eps)^-1/2`, times the weight as stored (no `1 +`),
//! computed in f32 like transformers does.

use candle_core::{DType, Tensor, D};

use crate::error::Result;

#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Option<Tensor>,
    eps: f64,
}

impl RmsNorm {
    pub fn new(weight: Tensor, eps: f64) -> Self {
        Self {
            weight: Some(weight),
            eps,
        }
    }

    /// The scale-free variant used for values.
    pub fn unscaled(eps: f64) -> Self {
        Self { weight: None, eps }
    }

    /// Normalizes over the last dimension.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = x.dtype();
        let xf = x.to_dtype(DType::F32)?;
        let ms = (xf.sqr()?.mean_keepdim(D::Minus1)? + self.eps)?;
        let normed = xf.broadcast_mul(&ms.powf(-0.5)?)?;
        let normed = match &self.weight {
            Some(w) => normed.broadcast_mul(&w.to_dtype(DType::F32)?)?,
            None => normed,
        };
        Ok(normed.to_dtype(dtype)?)
    }
}
