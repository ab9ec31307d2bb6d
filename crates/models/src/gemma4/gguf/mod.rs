//! Gemma 4 text targets from GGUF files in the layout llama.cpp's `convert_hf_to_gguf.py` writes
//! (`general.architecture = gemma4`), and their assistants (`gemma4-assistant`, in
//! `assistant.rs`).
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
//!   size; the end-of-sequence ids are the tokenizer's `eos_token_id` and `eot_token_id`;
//! - a mixture-of-experts block (`enable_moe_block`) is `expert_count > 0`, with
//!   `expert_used_count` and `expert_feed_forward_length` for `top_k_experts` and
//!   `moe_intermediate_size`; its tensors keep their values and layout (the experts' 3-D
//!   weights list `[hidden, 2 * moe_intermediate, experts]` and `[moe_intermediate, hidden,
//!   experts]` innermost first, so they read back as the checkpoint's `[experts, 2I, hidden]`
//!   and `[experts, hidden, I]`), and `router.per_expert_scale` becomes `ffn_down_exps.scale`
//!   unchanged.
//!
//! Matrices stored quantized in a format the CPU engine has kernels for (Q4_0, Q5_0, Q8_0,
//! Q4_K, Q6_K) are handed over as stored, to be packed for those kernels (the model then runs
//! on the CPU), and so are float matrices (F32, F16, BF16) when the model computes in f32 on
//! the CPU; other float tensors load as candle tensors. Any other quantized type, or a
//! quantized tensor where a float one is needed (a norm), is refused naming the tensor and type.
//!
//! The tensors and names are here; the configuration from the metadata is in `config.rs`, the
//! typed metadata reads in `meta.rs`.

mod assistant;
mod config;
mod meta;

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use serde_json::{json, Map, Value as Json};

use super::config::{CheckpointLayout, Gemma4TextConfig};
use crate::checkpoint::{Checkpoint, StoredMatrix, TensorStore};
use crate::cpu::WeightFormat;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;

pub use assistant::{open_assistant, ASSISTANT_ARCHITECTURE};

/// `general.architecture` of a Gemma 4 text model in llama.cpp's naming.
pub const ARCHITECTURE: &str = "gemma4";

/// Frequency factors at least this large mark RoPE pairs that do not rotate (the converter
/// writes 1e30).
const UNROTATED_FACTOR: f32 = 1e20;

/// The experts' fused gate and up projections `[experts, 2 * moe_intermediate, hidden]` (gate
/// rows first), as the converter writes `experts.gate_up_proj`; llama.cpp also loads them as
/// separate `ffn_gate_exps` and `ffn_up_exps`, which are joined back here.
const GATE_UP_EXPS: &str = "ffn_gate_up_exps.weight";

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
        // An assistant's projections between the target's width and its own.
        "pre_projection.weight" => Some("nextn.pre_projection.weight"),
        "post_projection.weight" => Some("nextn.post_projection.weight"),
        _ => None,
    };
    if let Some(top) = top {
        return Some(top.to_string());
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (index, rest) = rest.split_once('.')?;
    let index: usize = index.parse().ok()?;
    // Checkpoint tensors without a `.weight` suffix: the converter gives them one, except the
    // router's two scale vectors, which become `.scale` tensors beside another one's `.weight`.
    let whole = match rest {
        "layer_scalar" => Some("layer_output_scale.weight"),
        "router.scale" => Some("ffn_gate_inp.scale"),
        "router.per_expert_scale" => Some("ffn_down_exps.scale"),
        "experts.gate_up_proj" => Some(GATE_UP_EXPS),
        "experts.down_proj" => Some("ffn_down_exps.weight"),
        _ => None,
    };
    if let Some(whole) = whole {
        return Some(format!("blk.{index}.{whole}"));
    }
    let (module, suffix) = rest.rsplit_once('.')?;
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
        "pre_feedforward_layernorm_2" => "pre_ffw_norm_2",
        "post_feedforward_layernorm_1" => "post_ffw_norm_1",
        "post_feedforward_layernorm_2" => "post_ffw_norm_2",
        "router.proj" => "ffn_gate_inp",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "per_layer_input_gate" => "inp_gate",
        "per_layer_projection" => "proj",
        "post_per_layer_input_norm" => "post_norm",
        _ => return None,
    };
    Some(format!("blk.{index}.{base}.{suffix}"))
}

struct GgufStore {
    file: GgufFile,
}

impl TensorStore for GgufStore {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let gguf = gguf_name(name)?;
        if let Some((gate, _)) = self.split_gate_up(&gguf) {
            let mut dims = self.file.tensor_dims(&gate).ok()?;
            // The up half adds as many rows as the gate half has.
            *dims.get_mut(1)? *= 2;
            return Some(dims);
        }
        self.file.tensor_dims(&gguf).ok()
    }

    fn load(&self, name: &str) -> Result<Tensor> {
        match self.locate(name)? {
            Located::Tensor(gguf) => self.dense(&gguf),
            Located::GateUp { gate, up } => self.joined_gate_up(&gate, &up),
        }
    }

    fn display_name(&self, name: &str) -> String {
        gguf_name(name).unwrap_or_else(|| format!("{name} (no GGUF counterpart)"))
    }

    fn stored(&self, name: &str, floats: bool) -> Result<Option<StoredMatrix<'_>>> {
        match self.locate(name)? {
            Located::Tensor(gguf) => self.stored_matrix(&gguf, floats),
            Located::GateUp { gate, up } => self.joined_stored(&gate, &up, floats),
        }
    }

    fn release(&self, name: &str) {
        match self.locate(name) {
            Ok(Located::Tensor(gguf)) => self.file.release(&gguf),
            Ok(Located::GateUp { gate, up }) => {
                self.file.release(&gate);
                self.file.release(&up);
            }
            Err(_) => {}
        }
    }
}

/// Where the file keeps the tensor a loader asks for.
enum Located {
    Tensor(String),
    /// A layer's fused expert gate/up weight, stored as its two halves.
    GateUp {
        gate: String,
        up: String,
    },
}

/// Whether a GGUF type is one of the float types [`GgufStore::dense`] reads.
fn is_float(dtype: GgmlDType) -> bool {
    matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
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
                    "{}: tensor {gguf} is {other:?}; only matrices load from quantized types, \
                     other Gemma 4 tensors from F32, F16 or BF16",
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

    /// A tensor by its GGUF name as stored, when it is quantized in a format with CPU kernels
    /// or, with `floats`, a float.
    fn stored_matrix(&self, gguf: &str, floats: bool) -> Result<Option<StoredMatrix<'_>>> {
        let dims = self.file.tensor_dims(gguf)?;
        let raw = self.file.raw(gguf, &dims)?;
        if is_float(raw.dtype) && !floats {
            return Ok(None);
        }
        let width = dims.last().copied().unwrap_or(0);
        match WeightFormat::from_ggml(raw.dtype).filter(|f| f.row_bytes(width).is_some()) {
            Some(format) => Ok(Some(StoredMatrix {
                format,
                dims: raw.dims,
                bytes: Cow::Borrowed(raw.bytes),
            })),
            None => Err(ModelError::Unsupported(format!(
                "{}: tensor {gguf} is {:?}, a type specd has no CPU kernel for; Gemma 4 GGUF \
                 matrices load from F32, F16, BF16, Q4_0, Q5_0, Q8_0, Q4_K or Q6_K",
                self.file.path().display(),
                raw.dtype
            ))),
        }
    }

    /// Separate stored expert gate and up tensors `[experts, intermediate, hidden]` as one
    /// `[experts, 2 * intermediate, hidden]`, each expert's gate rows before its up rows.
    fn joined_stored(
        &self,
        gate: &str,
        up: &str,
        floats: bool,
    ) -> Result<Option<StoredMatrix<'_>>> {
        let (g, u) = (
            self.stored_matrix(gate, floats)?,
            self.stored_matrix(up, floats)?,
        );
        let (g, u) = match (g, u) {
            (None, None) => return Ok(None),
            (Some(g), Some(u)) if g.format == u.format && g.dims == u.dims && g.dims.len() == 3 => {
                (g, u)
            }
            _ => {
                return Err(ModelError::Unsupported(format!(
                    "{}: tensors {gate} ({}) and {up} ({}) must be stored alike to be joined as \
                     packed expert weights",
                    self.file.path().display(),
                    self.stored_as(gate),
                    self.stored_as(up),
                )))
            }
        };
        let (experts, half) = (g.dims[0], g.dims[1]);
        let mut bytes = Vec::with_capacity(g.bytes.len() + u.bytes.len());
        for x in 0..experts {
            bytes.extend_from_slice(g.rows(x * half, half));
            bytes.extend_from_slice(u.rows(x * half, half));
        }
        let mut dims = g.dims.clone();
        dims[1] *= 2;
        Ok(Some(StoredMatrix {
            format: g.format,
            dims,
            bytes: Cow::Owned(bytes),
        }))
    }

    /// The GGUF tensor(s) holding the tensor the loaders call `name`.
    fn locate(&self, name: &str) -> Result<Located> {
        let gguf = gguf_name(name).ok_or_else(|| ModelError::MissingTensor {
            name: self.display_name(name),
        })?;
        Ok(match self.split_gate_up(&gguf) {
            Some((gate, up)) => Located::GateUp { gate, up },
            None => Located::Tensor(gguf),
        })
    }

    /// The separate expert gate and up tensors standing in for `gguf` when it is a layer's
    /// fused `ffn_gate_up_exps` and the file has the halves instead.
    fn split_gate_up(&self, gguf: &str) -> Option<(String, String)> {
        let block = gguf.strip_suffix(GATE_UP_EXPS)?;
        if self.file.has_tensor(gguf) {
            return None;
        }
        let gate = format!("{block}ffn_gate_exps.weight");
        let up = format!("{block}ffn_up_exps.weight");
        (self.file.has_tensor(&gate) && self.file.has_tensor(&up)).then_some((gate, up))
    }

    /// `[experts, intermediate, hidden]` gate and up halves as one `[experts, 2 *
    /// intermediate, hidden]` tensor, gate rows first as in the checkpoint.
    fn joined_gate_up(&self, gate: &str, up: &str) -> Result<Tensor> {
        let (g, u) = (self.dense(gate)?, self.dense(up)?);
        if g.rank() != 3 || g.dims() != u.dims() {
            return Err(ModelError::ShapeMismatch {
                name: up.to_string(),
                expected: g.dims().to_vec(),
                found: u.dims().to_vec(),
            });
        }
        // Halves stored in different float types meet in F32, which holds both exactly.
        let (g, u) = if g.dtype() == u.dtype() {
            (g, u)
        } else {
            (g.to_dtype(DType::F32)?, u.to_dtype(DType::F32)?)
        };
        Ok(Tensor::cat(&[g, u], 1)?)
    }

    /// A tensor's stored type and shape, for error messages.
    fn stored_as(&self, gguf: &str) -> String {
        match self.file.tensor_dims(gguf) {
            Ok(dims) => match self.file.raw(gguf, &dims) {
                Ok(raw) => format!("{:?} {dims:?}", raw.dtype),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        }
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
            (
                "model.layers.2.router.proj.weight",
                "blk.2.ffn_gate_inp.weight",
            ),
            ("model.layers.2.router.scale", "blk.2.ffn_gate_inp.scale"),
            (
                "model.layers.2.router.per_expert_scale",
                "blk.2.ffn_down_exps.scale",
            ),
            (
                "model.layers.2.experts.gate_up_proj",
                "blk.2.ffn_gate_up_exps.weight",
            ),
            (
                "model.layers.2.experts.down_proj",
                "blk.2.ffn_down_exps.weight",
            ),
            (
                "model.layers.2.pre_feedforward_layernorm_2.weight",
                "blk.2.pre_ffw_norm_2.weight",
            ),
            (
                "model.layers.2.post_feedforward_layernorm_1.weight",
                "blk.2.post_ffw_norm_1.weight",
            ),
            (
                "model.layers.2.post_feedforward_layernorm_2.weight",
                "blk.2.post_ffw_norm_2.weight",
            ),
        ] {
            assert_eq!(gguf_name(hf).as_deref(), Some(gguf), "{hf}");
        }
        for unknown in [
            "model.layers.x.mlp.up_proj.weight",
            "model.layers.0.mlp.up_proj.scale",
            "model.layers.0.router.proj.scale",
            "model.layers.0.experts.gate_up_proj.weight",
            "model.vision_tower.weight",
        ] {
            assert_eq!(gguf_name(unknown), None, "{unknown}");
        }
    }
}
