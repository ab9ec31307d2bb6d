//! A bias-optional linear layer that takes the row-exact kernel when asked to.

use candle_core::{DType, Device, Tensor};

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::exact::exact_linear;

#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

/// Whether a forward may use the row-exact kernels: CPU, f32, and blocks of a few rows.
pub fn exact_eligible(device: &Device, dtype: DType, rows_per_block: usize) -> bool {
    device.is_cpu() && dtype == DType::F32 && rows_per_block <= crate::exact::EXACT_MAX_ROWS
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    /// Loads `{name}.weight` of shape `[out, in]` and, with `bias`, `{name}.bias`.
    pub fn load(ckpt: &Checkpoint, name: &str, out: usize, inp: usize, bias: bool) -> Result<Self> {
        let weight = ckpt.tensor(&format!("{name}.weight"), &[out, inp])?;
        let bias = if bias {
            Some(ckpt.tensor(&format!("{name}.bias"), &[out])?)
        } else {
            None
        };
        Ok(Self { weight, bias })
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// `x [n, in]` to `[n, out]`.
    pub fn forward(&self, x: &Tensor, exact: bool) -> Result<Tensor> {
        let y = if exact {
            exact_linear(x, &self.weight)?
        } else {
            x.matmul(&self.weight.t()?)?
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}
