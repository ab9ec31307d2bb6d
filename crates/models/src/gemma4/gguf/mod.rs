//! Gemma 4 text targets from GGUF files in the layout llama.cpp's `convert_hf_to_gguf.py` writes
//! (`general.architecture = gemma4`).
//!
//! The configuration is rebuilt from the GGUF metadata as the `config.json` fields the
//! safetensors path reads, so both go through one resolution and one set of checks; tensors
//! answer to the Hugging Face names the loaders ask for. The converter stores Gemma 4 weights
//! as they are in the checkpoint (no `1 +` on norm weights, no q/k permutation, no embedding
//! scaling, and GGUF's innermost-first dimensions read back as `[out, in]`), so no weight needs
//! transforming back. What it does change is undone here:
//!
//! - full attention's proportional RoPE becomes a `rope_freqs` tensor of frequency factors, 1
//!   for the rotated pairs and 1e30 for the others; the count of ones gives back
//!   `partial_rotary_factor`;
//! - the converter writes `num_global_key_value_heads` as the full layers'
//!   `attention.head_count_kv` whenever its parsed config has one, also where transformers
//!   ignores it (without `attention_k_eq_v`), so every layer's KV head count is read from its
//!   key projection instead;
//! - `attention_k_eq_v` is the absence of `attn_v` on full layers, and a double-wide MLP a
//!   per-layer `feed_forward_length` array;
//! - the vocabulary is the rows of `token_embd`, which the converter cuts to the tokenizer's
//!   size; the end-of-sequence ids are the tokenizer's `eos_token_id` and `eot_token_id`.
//!
//! Dense F32, F16 and BF16 tensors only; mixture-of-experts files are refused.
//!
//! The tensors and names are here; the configuration from the metadata is in `config.rs`, the
//! typed metadata reads in `meta.rs`.

mod config;
mod meta;

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use serde_json::{json, Map, Value as Json};

use super::config::{CheckpointLayout, Gemma4TextConfig};
use crate::checkpoint::{Checkpoint, TensorStore};
use crate::error::{ModelError, Result};
use crate::qwen2::GgufFile;

/// `general.architecture` of a Gemma 4 text model in llama.cpp's naming.
pub const ARCHITECTURE: &str = "gemma4";

/// Frequency factors at least this large mark RoPE pairs that do not rotate (the converter
/// writes 1e30).
const UNROTATED_FACTOR: f32 = 1e20;

/// Opens a Gemma 4 GGUF file: its configuration, and its tensors under Hugging Face names,
/// converted to `dtype` on `device` when loaded.
pub fn open(
    path: &Path,
    dtype: DType,
    device: &Device,
) -> Result<(Gemma4TextConfig, CheckpointLayout, Checkpoint)> {
    let store = GgufStore {
        file: GgufFile::open(path)?,
    };
    let config = store.config_json()?;
    let cfg = Gemma4TextConfig::from_text_json(&config, "", None)?;
    let layout = CheckpointLayout {
        text_prefix: "model.".into(),
        multimodal: false,
    };
    Ok((
        cfg,
        layout,
        Checkpoint::from_store(Box::new(store), dtype, device),
    ))
}

/// The GGUF name of the tensor the loaders call `name` (`model.layers.3.mlp.up_proj.weight` is
/// `blk.3.ffn_up.weight`).
pub fn gguf_name(name: &str) -> Option<String> {
    let top = match name {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.embed_tokens_per_layer.weight" => Some("per_layer_token_embd.weight"),
        "model.per_layer_model_projection.weight" => Some("per_layer_model_proj.weight"),
        "model.per_layer_projection_norm.weight" => Some("per_layer_proj_norm.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(top) = top {
        return Some(top.to_string());
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (index, rest) = rest.split_once('.')?;
    let index: usize = index.parse().ok()?;
    // The layer scalar is the one tensor without a `.weight` suffix in the checkpoint.
    let (module, suffix) = match rest {
        "layer_scalar" => ("layer_scalar", "weight"),
        _ => rest.rsplit_once('.')?,
    };
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let base = match module {
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "post_attention_norm",
        "pre_feedforward_layernorm" => "ffn_norm",
        "post_feedforward_layernorm" => "post_ffw_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "per_layer_input_gate" => "inp_gate",
        "per_layer_projection" => "proj",
        "post_per_layer_input_norm" => "post_norm",
        "layer_scalar" => "layer_output_scale",
        _ => return None,
    };
    Some(format!("blk.{index}.{base}.{suffix}"))
}

struct GgufStore {
    file: GgufFile,
}

impl TensorStore for GgufStore {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.file.tensor_dims(&gguf_name(name)?).ok()
    }

    fn load(&self, name: &str) -> Result<Tensor> {
        let gguf = gguf_name(name).ok_or_else(|| ModelError::MissingTensor {
            name: self.display_name(name),
        })?;
        self.dense(&gguf)
    }

    fn display_name(&self, name: &str) -> String {
        gguf_name(name).unwrap_or_else(|| format!("{name} (no GGUF counterpart)"))
    }
}

impl GgufStore {
    /// A tensor by its GGUF name, on the CPU in its stored float dtype.
    fn dense(&self, gguf: &str) -> Result<Tensor> {
        let dims = self.file.tensor_dims(gguf)?;
        let raw = self.file.raw(gguf, &dims)?;
        let dtype = match raw.dtype {
            GgmlDType::F32 => DType::F32,
            GgmlDType::F16 => DType::F16,
            GgmlDType::BF16 => DType::BF16,
            other => {
                return Err(ModelError::Unsupported(format!(
                    "{}: tensor {gguf} is {other:?}; Gemma 4 GGUF files load from F32, F16 or \
                     BF16 tensors only",
                    self.file.path().display()
                )))
            }
        };
        Ok(Tensor::from_raw_buffer(
            raw.bytes,
            dtype,
            &raw.dims,
            &Device::Cpu,
        )?)
    }

    fn dims(&self, gguf: &str) -> Result<Vec<usize>> {
        self.file
            .tensor_dims(gguf)
            .map_err(|_| ModelError::MissingTensor {
                name: gguf.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::gguf_name;

    #[test]
    fn loader_names_map_to_the_converter_names() {
        for (hf, gguf) in [
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("lm_head.weight", "output.weight"),
            ("model.norm.weight", "output_norm.weight"),
            (
                "model.layers.0.self_attn.o_proj.weight",
                "blk.0.attn_output.weight",
            ),
            (
                "model.layers.12.self_attn.q_proj.bias",
                "blk.12.attn_q.bias",
            ),
            ("model.layers.3.mlp.up_proj.weight", "blk.3.ffn_up.weight"),
            (
                "model.layers.3.pre_feedforward_layernorm.weight",
                "blk.3.ffn_norm.weight",
            ),
            (
                "model.layers.3.post_per_layer_input_norm.weight",
                "blk.3.post_norm.weight",
            ),
            (
                "model.layers.5.layer_scalar",
                "blk.5.layer_output_scale.weight",
            ),
        ] {
            assert_eq!(gguf_name(hf).as_deref(), Some(gguf), "{hf}");
        }
        for unknown in [
            "model.layers.x.mlp.up_proj.weight",
            "model.layers.0.mlp.up_proj.scale",
            "model.layers.0.router.proj.weight",
            "model.vision_tower.weight",
        ] {
            assert_eq!(gguf_name(unknown), None, "{unknown}");
        }
    }
}
