//! The target's token embedding, read straight from the target checkpoint.
//!
//! The assistant embeds its input tokens with the target's table. A drafter process opens the
//! target checkpoint (a safetensors directory or a GGUF file) memory-mapped and reads one row
//! per drafted token, so it never loads the rest of the target (nor, for a large vocabulary,
//! the whole table).

use std::borrow::Cow;
use std::path::Path;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{DType, Device, Tensor};

use crate::checkpoint::Checkpoint;
use crate::error::{ModelError, Result};
use crate::gemma4::{CheckpointLayout, Gemma4TextConfig};
use crate::gguf::GgufFile;

/// The GGUF name of the target's token embedding.
const GGUF_TABLE: &str = "token_embd.weight";

/// Where the table's rows are read from.
enum Table {
    Safetensors(Checkpoint),
    Gguf(GgufFile),
}

pub struct TargetEmbedding {
    table: Table,
    name: String,
    dtype: DType,
    device: Device,
    vocab_size: usize,
    hidden_size: usize,
    /// `sqrt(hidden_size)` rounded to the compute dtype, as transformers multiplies it.
    scale: f64,
}

impl TargetEmbedding {
    /// Opens the target checkpoint at `path` (a checkpoint directory or a Gemma 4 GGUF file),
    /// whose resolved config is `cfg`, and checks the embedding table's shape.
    pub fn open(
        path: &Path,
        cfg: &Gemma4TextConfig,
        layout: &CheckpointLayout,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let expected = vec![cfg.vocab_size, cfg.hidden_size];
        let (table, name, found) = if path.is_file() {
            let file = GgufFile::open(path)?;
            let found = file.tensor_dims(GGUF_TABLE)?;
            (Table::Gguf(file), GGUF_TABLE.to_string(), found)
        } else {
            let checkpoint = Checkpoint::open(path, dtype, device)?;
            let name = format!("{}embed_tokens.weight", layout.text_prefix);
            let found = checkpoint.shape_of(&name)?;
            (Table::Safetensors(checkpoint), name, found)
        };
        if found != expected {
            return Err(ModelError::ShapeMismatch {
                name,
                expected,
                found,
            });
        }
        Ok(Self {
            table,
            name,
            dtype,
            device: device.clone(),
            vocab_size: cfg.vocab_size,
            hidden_size: cfg.hidden_size,
            scale: scale_in_dtype((cfg.hidden_size as f64).sqrt(), dtype),
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn hidden_size(&self) -> usize {
        self.hidden_size
    }

    /// The scaled embedding of `token`, `[1, hidden]`.
    pub fn embed(&self, token: u32) -> Result<Tensor> {
        if token as usize >= self.vocab_size {
            return Err(ModelError::Invalid(format!(
                "token id {token} is not below the target's vocabulary size {}",
                self.vocab_size
            )));
        }
        let row = match &self.table {
            Table::Safetensors(checkpoint) => checkpoint.row(&self.name, token as usize)?,
            Table::Gguf(file) => self.gguf_row(file, token as usize)?,
        };
        Ok((row * self.scale)?)
    }

    /// Row `index` of the GGUF table as `[1, hidden]` in the compute dtype: only that row's
    /// bytes are read (and dequantized, for a quantized table).
    fn gguf_row(&self, file: &GgufFile, index: usize) -> Result<Tensor> {
        let raw = file.raw(&self.name, &[self.vocab_size, self.hidden_size])?;
        let (block, block_bytes) = (raw.dtype.block_size(), raw.dtype.type_size());
        if !self.hidden_size.is_multiple_of(block) {
            return Err(ModelError::Unsupported(format!(
                "{}: tensor {}: rows of {} values are not whole {:?} blocks of {block}",
                file.path().display(),
                self.name,
                self.hidden_size,
                raw.dtype
            )));
        }
        let row_bytes = self.hidden_size / block * block_bytes;
        let bytes = &raw.bytes[index * row_bytes..(index + 1) * row_bytes];
        let shape = [1, self.hidden_size];
        let row = match raw.dtype {
            GgmlDType::F32 => Tensor::from_raw_buffer(bytes, DType::F32, &shape, &Device::Cpu)?,
            GgmlDType::F16 => Tensor::from_raw_buffer(bytes, DType::F16, &shape, &Device::Cpu)?,
            GgmlDType::BF16 => Tensor::from_raw_buffer(bytes, DType::BF16, &shape, &Device::Cpu)?,
            quantized => {
                let storage = QStorage::from_data(Cow::Borrowed(bytes), &Device::Cpu, quantized)?;
                QTensor::new(storage, (1, self.hidden_size))?.dequantize(&Device::Cpu)?
            }
        };
        Ok(row.to_dtype(self.dtype)?.to_device(&self.device)?)
    }
}

/// transformers multiplies by the scale cast to the weight dtype (sqrt(3072) becomes 55.5 in
/// bf16); the target does the same, and so must its drafter.
fn scale_in_dtype(scale: f64, dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => half::bf16::from_f64(scale).to_f64(),
        DType::F16 => half::f16::from_f64(scale).to_f64(),
        _ => scale as f32 as f64,
    }
}
