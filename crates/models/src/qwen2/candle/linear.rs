//! A GGUF linear layer (`x W^T + b`) on candle's quantized matmul.

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Module, Tensor};

use super::super::error::Result;

pub(crate) struct QLinear {
    matmul: QMatMul,
    bias: Option<Tensor>,
}

impl QLinear {
    /// `weight` is `[out, in]`; `bias`, when present, is `[out]` f32.
    pub(crate) fn new(weight: QTensor, bias: Option<Tensor>) -> Result<Self> {
        Ok(Self {
            matmul: QMatMul::from_qtensor(weight)?,
            bias,
        })
    }

    /// `x [m, in]` to `[m, out]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.matmul.forward(&x.contiguous()?)?;
        let y = match &self.bias {
            Some(bias) => y.broadcast_add(bias)?,
            None => y,
        };
        Ok(y.to_dtype(DType::F32)?)
    }
}
