//! Reading tensors out of a GGUF file, with shape checks and the one-time requantization of
//! formats that candle multiplies with scalar code on CPU.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use super::error::{Qwen2Error, Result};

/// An open GGUF file: its parsed header and a reader for tensor data.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: File,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let io_err = |source| Qwen2Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut reader = File::open(path).map_err(io_err)?;
        let content = Content::read(&mut reader).map_err(|source| Qwen2Error::Gguf {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            content,
            reader,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// The tensor's shape in candle order (outermost first), without loading it.
    pub fn tensor_dims(&self, name: &str) -> Result<Vec<usize>> {
        let info =
            self.content
                .tensor_infos
                .get(name)
                .ok_or_else(|| Qwen2Error::MissingTensor {
                    name: name.to_string(),
                })?;
        Ok(info.shape.dims().to_vec())
    }

    /// Loads a tensor as stored, after checking its shape.
    pub fn qtensor(&mut self, name: &str, expected: &[usize], device: &Device) -> Result<QTensor> {
        let found = self.tensor_dims(name)?;
        if found != expected {
            return Err(Qwen2Error::TensorShape {
                name: name.to_string(),
                expected: expected.to_vec(),
                found,
            });
        }
        self.content
            .tensor(&mut self.reader, name, device)
            .map_err(|source| Qwen2Error::TensorLoad {
                name: name.to_string(),
                source,
            })
    }

    /// Loads a small tensor (norm weight, bias) as a dense f32 tensor.
    pub fn dense(&mut self, name: &str, expected: &[usize], device: &Device) -> Result<Tensor> {
        let q = self.qtensor(name, expected, device)?;
        q.dequantize(device)
            .and_then(|t| t.to_dtype(DType::F32))
            .map_err(|source| Qwen2Error::TensorLoad {
                name: name.to_string(),
                source,
            })
    }
}

/// Formats whose CPU dot product in candle 0.11 is scalar code (no AVX2/NEON kernel).
pub fn has_slow_cpu_kernel(dtype: GgmlDType) -> bool {
    matches!(
        dtype,
        GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1 | GgmlDType::Q8_1
    )
}

/// Re-encodes a matmul weight as Q8_0 when it is stored in a format with a slow CPU kernel.
/// Q8_0 has a vectorized kernel and keeps the values within a fraction of a quantization step.
pub fn requantize_for_cpu(name: &str, tensor: QTensor, device: &Device) -> Result<QTensor> {
    let from = tensor.dtype();
    if !device.is_cpu() || !has_slow_cpu_kernel(from) {
        return Ok(tensor);
    }
    let wrap = |source| Qwen2Error::Requantize {
        name: name.to_string(),
        from,
        source,
    };
    let dense = tensor.dequantize(device).map_err(wrap)?;
    let requantized = QTensor::quantize(&dense, GgmlDType::Q8_0).map_err(wrap)?;
    tracing::debug!(
        tensor = name,
        ?from,
        "requantized to Q8_0 for the CPU kernel"
    );
    Ok(requantized)
}
