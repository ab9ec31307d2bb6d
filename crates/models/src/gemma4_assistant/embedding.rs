//! The target's token embedding, read straight from the target checkpoint.
//!
//! The assistant embeds its input tokens with the target's table. A drafter process opens the
//! target checkpoint memory-mapped and reads one row per drafted token, so it never loads the
//! rest of the target (nor, for a large vocabulary, the whole table).

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::checkpoint::Checkpoint;
use crate::error::{ModelError, Result};
use crate::gemma4::{CheckpointLayout, Gemma4TextConfig};

pub struct TargetEmbedding {
    checkpoint: Checkpoint,
    name: String,
    vocab_size: usize,
    hidden_size: usize,
    /// `sqrt(hidden_size)` rounded to the compute dtype, as transformers multiplies it.
    scale: f64,
}

impl TargetEmbedding {
    /// Opens the target checkpoint in `dir`, whose resolved config is `cfg`, and checks the
    /// embedding table's shape.
    pub fn open(
        dir: &Path,
        cfg: &Gemma4TextConfig,
        layout: &CheckpointLayout,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let checkpoint = Checkpoint::open(dir, dtype, device)?;
        let name = format!("{}embed_tokens.weight", layout.text_prefix);
        let found = checkpoint.shape_of(&name)?;
        let expected = vec![cfg.vocab_size, cfg.hidden_size];
        if found != expected {
            return Err(ModelError::ShapeMismatch {
                name,
                expected,
                found,
            });
        }
        Ok(Self {
            checkpoint,
            name,
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
        Ok((self.checkpoint.row(&self.name, token as usize)? * self.scale)?)
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
