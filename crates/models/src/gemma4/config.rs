//! Gemma 4 text configuration, read from a Hugging Face `config.json`.
//!
//! Accepts both `model_type: gemma4_text` and the multimodal `model_type: gemma4` whose
//! `text_config` holds the language model, and both ways of writing the geometry of full
//! attention layers: the top-level `global_head_dim` / `num_global_key_value_heads` of published
//! checkpoints and the `per_layer_config` overrides that transformers 5.23 writes.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::error::ModelError;

/// Which attention a decoder layer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerKind {
    Sliding,
    Full,
}

impl LayerKind {
    fn parse(name: &str, field: &str) -> Result<Self, ModelError> {
        match name {
            "sliding_attention" => Ok(Self::Sliding),
            "full_attention" => Ok(Self::Full),
            other => Err(ModelError::config(
                field,
                format!("unknown layer type {other:?}"),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sliding => "sliding_attention",
            Self::Full => "full_attention",
        }
    }
}

/// RoPE flavour of one layer type.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    pub theta: f64,
    /// Fraction of the head dimension that rotates ("proportional" RoPE); 1.0 rotates all of it.
    pub partial_rotary_factor: f64,
    /// Divides the inverse frequencies (`factor` of proportional RoPE).
    pub factor: f64,
    pub proportional: bool,
}

/// Geometry of one decoder layer once every override is applied.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerGeometry {
    pub kind: LayerKind,
    pub head_dim: usize,
    pub num_kv_heads: usize,
    /// Index of the layer whose K/V this layer reads: itself unless it is KV-shared.
    pub kv_source: usize,
    /// Values come from the key projection (`attention_k_eq_v` on full layers).
    pub k_eq_v: bool,
    pub mlp_intermediate: usize,
}

/// The resolved Gemma 4 text configuration.
#[derive(Debug, Clone)]
pub struct Gemma4TextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub rms_norm_eps: f64,
    pub sliding_window: usize,
    pub final_logit_softcapping: Option<f64>,
    pub attention_bias: bool,
    /// Per-layer embedding width (PLE); `None` when PLE is off.
    pub per_layer_input_size: Option<usize>,
    pub per_layer_vocab_size: usize,
    pub num_kv_shared_layers: usize,
    pub max_position_embeddings: usize,
    pub layers: Vec<LayerGeometry>,
    pub rope_sliding: RopeConfig,
    pub rope_full: RopeConfig,
    pub tie_word_embeddings: bool,
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
}

/// Where the text model's weights live inside the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointLayout {
    /// Prefix of the text model's tensors: `model.` or `model.language_model.`.
    pub text_prefix: String,
    pub multimodal: bool,
}

#[derive(Deserialize)]
struct RawRope {
    rope_type: Option<String>,
    rope_theta: Option<f64>,
    partial_rotary_factor: Option<f64>,
    factor: Option<f64>,
}

fn field<T: for<'de> Deserialize<'de>>(
    obj: &Value,
    name: &str,
    prefix: &str,
) -> Result<Option<T>, ModelError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| ModelError::config(&format!("{prefix}{name}"), e.to_string())),
    }
}

fn required<T: for<'de> Deserialize<'de>>(
    obj: &Value,
    name: &str,
    prefix: &str,
) -> Result<T, ModelError> {
    field(obj, name, prefix)?
        .ok_or_else(|| ModelError::config(&format!("{prefix}{name}"), "missing"))
}

fn token_ids(obj: &Value, name: &str, prefix: &str) -> Result<Vec<u32>, ModelError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(_)) => required::<Vec<u32>>(obj, name, prefix),
        Some(_) => Ok(vec![required::<u32>(obj, name, prefix)?]),
    }
}

impl Gemma4TextConfig {
    /// Reads `config.json` from a checkpoint directory.
    pub fn from_dir(dir: &Path) -> Result<(Self, CheckpointLayout), ModelError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::config("config.json", e.to_string()))?;
        Self::from_json(&value)
    }

    /// Resolves a parsed `config.json` of either shape.
    pub fn from_json(root: &Value) -> Result<(Self, CheckpointLayout), ModelError> {
        let model_type: String = required(root, "model_type", "")?;
        match model_type.as_str() {
            "gemma4_text" => {
                let cfg = Self::from_text_json(root, "", None)?;
                Ok((
                    cfg,
                    CheckpointLayout {
                        text_prefix: "model.".into(),
                        multimodal: false,
                    },
                ))
            }
            "gemma4" => {
                let text = root.get("text_config").ok_or_else(|| {
                    ModelError::config("text_config", "missing for model_type gemma4")
                })?;
                let cfg = Self::from_text_json(text, "text_config.", Some(root))?;
                Ok((
                    cfg,
                    CheckpointLayout {
                        text_prefix: "model.language_model.".into(),
                        multimodal: true,
                    },
                ))
            }
            other => Err(ModelError::config(
                "model_type",
                format!("expected gemma4_text or gemma4, got {other:?}"),
            )),
        }
    }

    /// Resolves a text config object; `outer` is the multimodal wrapper, whose top-level
    /// `tie_word_embeddings` and token ids take precedence when present.
    pub fn from_text_json(
        obj: &Value,
        prefix: &str,
        outer: Option<&Value>,
    ) -> Result<Self, ModelError> {
        let p = prefix;
        if field::<bool>(obj, "enable_moe_block", p)?.unwrap_or(false) {
            return Err(ModelError::Unsupported(format!(
                "{p}enable_moe_block: mixture-of-experts Gemma 4 checkpoints are not supported yet"
            )));
        }
        if let Some(mode) = field::<String>(obj, "use_bidirectional_attention", p)? {
            if mode == "all" {
                return Err(ModelError::Unsupported(format!(
                    "{p}use_bidirectional_attention: \"all\" (non-causal text attention) is not supported"
                )));
            }
        }
        let activation = field::<String>(obj, "hidden_activation", p)?
            .unwrap_or_else(|| "gelu_pytorch_tanh".into());
        if activation != "gelu_pytorch_tanh" {
            return Err(ModelError::Unsupported(format!(
                "{p}hidden_activation: only gelu_pytorch_tanh is supported, got {activation:?}"
            )));
        }

        let vocab_size: usize = field(obj, "vocab_size", p)?.unwrap_or(262_144);
        let hidden_size: usize = required(obj, "hidden_size", p)?;
        let intermediate_size: usize = required(obj, "intermediate_size", p)?;
        let num_layers: usize = required(obj, "num_hidden_layers", p)?;
        let num_heads: usize = required(obj, "num_attention_heads", p)?;
        let num_kv_heads: usize = field(obj, "num_key_value_heads", p)?.unwrap_or(4);
        let head_dim: usize = field(obj, "head_dim", p)?.unwrap_or(256);
        let k_eq_v: bool = field(obj, "attention_k_eq_v", p)?.unwrap_or(false);
        let num_kv_shared_layers: usize = field(obj, "num_kv_shared_layers", p)?.unwrap_or(0);
        let double_wide: bool = field(obj, "use_double_wide_mlp", p)?.unwrap_or(false);
        let ple: usize = field(obj, "hidden_size_per_layer_input", p)?.unwrap_or(256);
        if hidden_size == 0
            || num_layers == 0
            || num_heads == 0
            || head_dim == 0
            || num_kv_heads == 0
        {
            return Err(ModelError::config(
                &format!("{p}hidden_size"),
                "hidden_size, num_hidden_layers, num_attention_heads, head_dim and num_key_value_heads must be positive",
            ));
        }
        if num_kv_shared_layers > num_layers {
            return Err(ModelError::config(
                &format!("{p}num_kv_shared_layers"),
                format!("{num_kv_shared_layers} exceeds num_hidden_layers {num_layers}"),
            ));
        }

        let kinds = Self::layer_kinds(obj, p, num_layers)?;
        let overrides = Self::full_layer_overrides(obj, p, &kinds, k_eq_v)?;

        let first_shared = num_layers - num_kv_shared_layers;
        let mut layers = Vec::with_capacity(num_layers);
        for (i, &kind) in kinds.iter().enumerate() {
            let (hd, nkv) = overrides
                .get(&i)
                .map(|o| {
                    (
                        o.head_dim.unwrap_or(head_dim),
                        o.num_kv_heads.unwrap_or(num_kv_heads),
                    )
                })
                .unwrap_or((head_dim, num_kv_heads));
            if !num_heads.is_multiple_of(nkv) {
                return Err(ModelError::config(
                    &format!("{p}num_key_value_heads"),
                    format!("layer {i}: {num_heads} attention heads are not a multiple of {nkv} kv heads"),
                ));
            }
            let shared = i >= first_shared;
            let kv_source = if shared {
                (0..first_shared).rev().find(|&j| kinds[j] == kind).ok_or_else(|| {
                    ModelError::config(
                        &format!("{p}num_kv_shared_layers"),
                        format!("layer {i} ({}) is KV-shared but no earlier layer of its type produces K/V", kind.as_str()),
                    )
                })?
            } else {
                i
            };
            layers.push(LayerGeometry {
                kind,
                head_dim: hd,
                num_kv_heads: nkv,
                kv_source,
                k_eq_v: k_eq_v && kind == LayerKind::Full,
                mlp_intermediate: intermediate_size * if double_wide && shared { 2 } else { 1 },
            });
        }
        for (i, l) in layers.iter().enumerate() {
            let src = &layers[l.kv_source];
            if src.head_dim != l.head_dim || src.num_kv_heads != l.num_kv_heads {
                return Err(ModelError::config(
                    &format!("{p}per_layer_config"),
                    format!(
                        "layer {i} shares K/V of layer {} whose geometry differs",
                        l.kv_source
                    ),
                ));
            }
        }

        let (rope_sliding, rope_full) = Self::rope(obj, p)?;
        let tie = outer
            .and_then(|o| o.get("tie_word_embeddings"))
            .or_else(|| obj.get("tie_word_embeddings"))
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let mut eos = token_ids(obj, "eos_token_id", p)?;
        if let Some(o) = outer {
            let outer_eos = token_ids(o, "eos_token_id", "")?;
            if !outer_eos.is_empty() {
                eos = outer_eos;
            }
        }
        Ok(Self {
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            rms_norm_eps: field(obj, "rms_norm_eps", p)?.unwrap_or(1e-6),
            sliding_window: field(obj, "sliding_window", p)?.unwrap_or(512),
            final_logit_softcapping: field(obj, "final_logit_softcapping", p)?,
            attention_bias: field(obj, "attention_bias", p)?.unwrap_or(false),
            per_layer_input_size: (ple > 0).then_some(ple),
            per_layer_vocab_size: field(obj, "vocab_size_per_layer_input", p)?.unwrap_or(262_144),
            num_kv_shared_layers,
            max_position_embeddings: field(obj, "max_position_embeddings", p)?.unwrap_or(131_072),
            layers,
            rope_sliding,
            rope_full,
            tie_word_embeddings: tie,
            eos_token_ids: eos,
            bos_token_id: field(obj, "bos_token_id", p)?,
        })
    }

    fn layer_kinds(obj: &Value, p: &str, num_layers: usize) -> Result<Vec<LayerKind>, ModelError> {
        let mut kinds = match field::<Vec<String>>(obj, "layer_types", p)? {
            Some(names) => {
                if names.len() != num_layers {
                    return Err(ModelError::config(
                        &format!("{p}layer_types"),
                        format!("has {} entries for {num_layers} layers", names.len()),
                    ));
                }
                names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| LayerKind::parse(n, &format!("{p}layer_types[{i}]")))
                    .collect::<Result<Vec<_>, _>>()?
            }
            // transformers' default pattern: five sliding layers, then one full layer.
            None => (0..num_layers)
                .map(|i| {
                    if (i + 1) % 6 == 0 {
                        LayerKind::Full
                    } else {
                        LayerKind::Sliding
                    }
                })
                .collect(),
        };
        // transformers forces the last layer to full attention; do the same so numbers agree.
        if let Some(last) = kinds.last_mut() {
            *last = LayerKind::Full;
        }
        Ok(kinds)
    }

    fn full_layer_overrides(
        obj: &Value,
        p: &str,
        kinds: &[LayerKind],
        k_eq_v: bool,
    ) -> Result<BTreeMap<usize, GeometryOverride>, ModelError> {
        let mut out = BTreeMap::new();
        match obj.get("per_layer_config") {
            Some(Value::Object(map)) => {
                for (key, value) in map {
                    let name = format!("{p}per_layer_config.{key}");
                    let idx: usize = key
                        .parse()
                        .map_err(|_| ModelError::config(&name, "key is not a layer index"))?;
                    if idx >= kinds.len() {
                        return Err(ModelError::config(
                            &name,
                            format!("layer {idx} does not exist"),
                        ));
                    }
                    let Value::Object(fields) = value else {
                        return Err(ModelError::config(&name, "expected an object of overrides"));
                    };
                    let mut o = GeometryOverride::default();
                    for (fname, fval) in fields {
                        let fpath = format!("{name}.{fname}");
                        let n = fval.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                            ModelError::config(&fpath, "expected a positive integer")
                        })? as usize;
                        match fname.as_str() {
                            "head_dim" => o.head_dim = Some(n),
                            "num_key_value_heads" => o.num_kv_heads = Some(n),
                            _ => {
                                return Err(ModelError::Unsupported(format!(
                                    "{fpath}: per-layer override of {fname:?} is not supported"
                                )))
                            }
                        }
                    }
                    out.insert(idx, o);
                }
            }
            Some(Value::Null) | None => {
                let global_head_dim: usize = field(obj, "global_head_dim", p)?.unwrap_or(512);
                let global_kv: Option<usize> = field(obj, "num_global_key_value_heads", p)?;
                for (i, k) in kinds.iter().enumerate() {
                    if *k == LayerKind::Full {
                        out.insert(
                            i,
                            GeometryOverride {
                                head_dim: Some(global_head_dim),
                                // transformers applies the global KV head count only with k_eq_v.
                                num_kv_heads: if k_eq_v { global_kv } else { None },
                            },
                        );
                    }
                }
            }
            Some(_) => {
                return Err(ModelError::config(
                    &format!("{p}per_layer_config"),
                    "expected an object",
                ))
            }
        }
        Ok(out)
    }

    fn rope(obj: &Value, p: &str) -> Result<(RopeConfig, RopeConfig), ModelError> {
        let raw: Option<BTreeMap<String, RawRope>> = field(obj, "rope_parameters", p)?;
        let default_sliding = RopeConfig {
            theta: 10_000.0,
            partial_rotary_factor: 1.0,
            factor: 1.0,
            proportional: false,
        };
        let default_full = RopeConfig {
            theta: 1_000_000.0,
            partial_rotary_factor: 0.25,
            factor: 1.0,
            proportional: true,
        };
        let Some(raw) = raw else {
            return Ok((default_sliding, default_full));
        };
        let resolve = |kind: LayerKind| -> Result<RopeConfig, ModelError> {
            let name = format!("{p}rope_parameters.{}", kind.as_str());
            let r = raw
                .get(kind.as_str())
                .ok_or_else(|| ModelError::config(&name, "missing"))?;
            let rope_type = r.rope_type.as_deref().unwrap_or("default");
            let proportional = match rope_type {
                "default" => false,
                "proportional" => true,
                other => {
                    return Err(ModelError::Unsupported(format!(
                        "{name}.rope_type: {other:?} is not supported"
                    )))
                }
            };
            Ok(RopeConfig {
                theta: r
                    .rope_theta
                    .ok_or_else(|| ModelError::config(&format!("{name}.rope_theta"), "missing"))?,
                partial_rotary_factor: if proportional {
                    r.partial_rotary_factor.unwrap_or(1.0)
                } else {
                    1.0
                },
                factor: if proportional {
                    r.factor.unwrap_or(1.0)
                } else {
                    1.0
                },
                proportional,
            })
        };
        Ok((resolve(LayerKind::Sliding)?, resolve(LayerKind::Full)?))
    }

    /// The last layer of a kind that computes its own K/V: the layer whose K/V a drafter reads.
    pub fn last_kv_producer(&self, kind: LayerKind) -> Option<usize> {
        (0..self.num_layers)
            .rev()
            .find(|&i| self.layers[i].kind == kind && self.layers[i].kv_source == i)
    }

    pub fn rope_for(&self, kind: LayerKind) -> &RopeConfig {
        match kind {
            LayerKind::Sliding => &self.rope_sliding,
            LayerKind::Full => &self.rope_full,
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct GeometryOverride {
    head_dim: Option<usize>,
    num_kv_heads: Option<usize>,
}
