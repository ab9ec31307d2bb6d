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

use super::raw_config::{LooseBool, RawOuter, RawRope, RawTextConfig, TokenIds};
use crate::config_json::{self, required};
use crate::error::ModelError;

/// Which attention a decoder layer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "String")]
pub enum LayerKind {
    Sliding,
    Full,
}

/// From the name `layer_types` uses; a derived enum would also take `{"full_attention": null}`.
impl TryFrom<String> for LayerKind {
    type Error = String;

    fn try_from(name: String) -> Result<Self, String> {
        match name.as_str() {
            "sliding_attention" => Ok(Self::Sliding),
            "full_attention" => Ok(Self::Full),
            other => Err(format!("unknown layer type {other:?}")),
        }
    }
}

impl LayerKind {
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
    /// The mixture-of-experts block every layer runs beside its MLP (`enable_moe_block`).
    pub moe: Option<MoeConfig>,
}

/// The experts of a mixture-of-experts Gemma 4 (26B-A4B and its like).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeConfig {
    pub num_experts: usize,
    /// Experts each token runs (`top_k_experts`).
    pub top_k: usize,
    /// Intermediate width of one expert (`moe_intermediate_size`).
    pub intermediate_size: usize,
}

/// Where the text model's weights live inside the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointLayout {
    /// Prefix of the text model's tensors: `model.` or `model.language_model.`.
    pub text_prefix: String,
    pub multimodal: bool,
}

impl Gemma4TextConfig {
    /// Reads `config.json` from a checkpoint directory.
    pub fn from_dir(dir: &Path) -> Result<(Self, CheckpointLayout), ModelError> {
        Self::from_json(&config_json::read(dir)?)
    }

    /// Resolves a parsed `config.json` of either shape.
    pub fn from_json(root: &Value) -> Result<(Self, CheckpointLayout), ModelError> {
        let model_type = required(config_json::model_type(root)?, "model_type")?;
        let (cfg, text_prefix, multimodal) = match model_type.as_str() {
            "gemma4_text" => (Self::from_text_json(root, "", None)?, "model.", false),
            "gemma4" => {
                let text = root.get("text_config").ok_or_else(|| {
                    ModelError::config("text_config", "missing for model_type gemma4")
                })?;
                let cfg = Self::from_text_json(text, "text_config.", Some(root))?;
                (cfg, "model.language_model.", true)
            }
            other => {
                return Err(ModelError::config(
                    "model_type",
                    format!("expected gemma4_text or gemma4, got {other:?}"),
                ))
            }
        };
        let layout = CheckpointLayout {
            text_prefix: text_prefix.into(),
            multimodal,
        };
        Ok((cfg, layout))
    }

    /// Resolves a text config object; `outer` is the multimodal wrapper, whose top-level
    /// `tie_word_embeddings` and token ids take precedence when present.
    pub fn from_text_json(
        obj: &Value,
        prefix: &str,
        outer: Option<&Value>,
    ) -> Result<Self, ModelError> {
        let raw = config_json::parse(obj, prefix)?;
        let outer = outer.map(|o| config_json::parse(o, "")).transpose()?;
        Self::resolve(raw, outer, prefix)
    }

    /// Applies defaults and checks to the fields as written; `p` prefixes every field name.
    pub(crate) fn resolve(
        mut raw: RawTextConfig,
        outer: Option<RawOuter>,
        p: &str,
    ) -> Result<Self, ModelError> {
        let moe = Self::moe(&raw, p)?;
        if raw.use_bidirectional_attention.as_deref() == Some("all") {
            return Err(ModelError::Unsupported(format!(
                "{p}use_bidirectional_attention: \"all\" (non-causal text attention) is not supported"
            )));
        }
        let activation = raw
            .hidden_activation
            .as_deref()
            .unwrap_or("gelu_pytorch_tanh");
        if activation != "gelu_pytorch_tanh" {
            return Err(ModelError::Unsupported(format!(
                "{p}hidden_activation: only gelu_pytorch_tanh is supported, got {activation:?}"
            )));
        }

        let field = |name: &str| format!("{p}{name}");
        let hidden_size = required(raw.hidden_size, &field("hidden_size"))?;
        let intermediate_size = required(raw.intermediate_size, &field("intermediate_size"))?;
        let num_layers = required(raw.num_hidden_layers, &field("num_hidden_layers"))?;
        let num_heads = required(raw.num_attention_heads, &field("num_attention_heads"))?;
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(4);
        let head_dim = raw.head_dim.unwrap_or(256);
        let k_eq_v = raw.attention_k_eq_v.unwrap_or(false);
        let num_kv_shared_layers = raw.num_kv_shared_layers.unwrap_or(0);
        let double_wide = raw.use_double_wide_mlp.unwrap_or(false);
        let ple = raw.hidden_size_per_layer_input.unwrap_or(256);
        if hidden_size == 0
            || num_layers == 0
            || num_heads == 0
            || head_dim == 0
            || num_kv_heads == 0
        {
            return Err(ModelError::config(
                &field("hidden_size"),
                "hidden_size, num_hidden_layers, num_attention_heads, head_dim and num_key_value_heads must be positive",
            ));
        }
        if num_kv_shared_layers > num_layers {
            return Err(ModelError::config(
                &field("num_kv_shared_layers"),
                format!("{num_kv_shared_layers} exceeds num_hidden_layers {num_layers}"),
            ));
        }

        let kinds = Self::layer_kinds(raw.layer_types.take(), p, num_layers)?;
        let overrides = Self::full_layer_overrides(&raw, p, &kinds, k_eq_v)?;

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
                    &field("num_key_value_heads"),
                    format!("layer {i}: {num_heads} attention heads are not a multiple of {nkv} kv heads"),
                ));
            }
            let shared = i >= first_shared;
            let kv_source = if shared {
                (0..first_shared).rev().find(|&j| kinds[j] == kind).ok_or_else(|| {
                    ModelError::config(
                        &field("num_kv_shared_layers"),
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
                    &field("per_layer_config"),
                    format!(
                        "layer {i} shares K/V of layer {} whose geometry differs",
                        l.kv_source
                    ),
                ));
            }
        }

        let (rope_sliding, rope_full) = Self::rope(raw.rope_parameters, p)?;
        let (outer_tie, outer_eos) = match outer {
            Some(o) => (o.tie_word_embeddings, TokenIds::into_vec(o.eos_token_id)),
            None => (LooseBool::Absent, Vec::new()),
        };
        let tie = match outer_tie {
            LooseBool::Absent => raw.tie_word_embeddings,
            set => set,
        };
        let eos = if outer_eos.is_empty() {
            TokenIds::into_vec(raw.eos_token_id)
        } else {
            outer_eos
        };
        Ok(Self {
            vocab_size: raw.vocab_size.unwrap_or(262_144),
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            sliding_window: raw.sliding_window.unwrap_or(512),
            final_logit_softcapping: raw.final_logit_softcapping,
            attention_bias: raw.attention_bias.unwrap_or(false),
            per_layer_input_size: (ple > 0).then_some(ple),
            per_layer_vocab_size: raw.vocab_size_per_layer_input.unwrap_or(262_144),
            num_kv_shared_layers,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(131_072),
            layers,
            rope_sliding,
            rope_full,
            tie_word_embeddings: !matches!(tie, LooseBool::Bool(false)),
            eos_token_ids: eos,
            bos_token_id: raw.bos_token_id,
            moe,
        })
    }

    /// The experts when `enable_moe_block` is set: each of their sizes must be given.
    fn moe(raw: &RawTextConfig, p: &str) -> Result<Option<MoeConfig>, ModelError> {
        if !raw.enable_moe_block.unwrap_or(false) {
            return Ok(None);
        }
        let field = |name: &str| format!("{p}{name}");
        let positive = |value: Option<usize>, name: &str| match value {
            Some(0) => Err(ModelError::config(
                &field(name),
                "must be positive with enable_moe_block",
            )),
            Some(v) => Ok(v),
            None => Err(ModelError::config(
                &field(name),
                "missing (required with enable_moe_block)",
            )),
        };
        let num_experts = positive(raw.num_experts, "num_experts")?;
        let top_k = positive(raw.top_k_experts, "top_k_experts")?;
        let intermediate_size = positive(raw.moe_intermediate_size, "moe_intermediate_size")?;
        if top_k > num_experts {
            return Err(ModelError::config(
                &field("top_k_experts"),
                format!("{top_k} exceeds num_experts {num_experts}"),
            ));
        }
        Ok(Some(MoeConfig {
            num_experts,
            top_k,
            intermediate_size,
        }))
    }

    fn layer_kinds(
        names: Option<Vec<LayerKind>>,
        p: &str,
        num_layers: usize,
    ) -> Result<Vec<LayerKind>, ModelError> {
        let mut kinds = match names {
            Some(kinds) if kinds.len() != num_layers => {
                return Err(ModelError::config(
                    &format!("{p}layer_types"),
                    format!("has {} entries for {num_layers} layers", kinds.len()),
                ))
            }
            Some(kinds) => kinds,
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
        raw: &RawTextConfig,
        p: &str,
        kinds: &[LayerKind],
        k_eq_v: bool,
    ) -> Result<BTreeMap<usize, GeometryOverride>, ModelError> {
        let Some(per_layer) = &raw.per_layer_config else {
            let global_head_dim = config_json::deferred(
                raw.global_head_dim.as_ref(),
                &format!("{p}global_head_dim"),
            )?
            .unwrap_or(512);
            let global_kv = config_json::deferred(
                raw.num_global_key_value_heads.as_ref(),
                &format!("{p}num_global_key_value_heads"),
            )?;
            let global = GeometryOverride {
                head_dim: Some(global_head_dim),
                // transformers applies the global KV head count only with k_eq_v.
                num_kv_heads: if k_eq_v { global_kv } else { None },
            };
            return Ok((0..kinds.len())
                .filter(|&i| kinds[i] == LayerKind::Full)
                .map(|i| (i, global))
                .collect());
        };
        let mut out = BTreeMap::new();
        for (key, fields) in per_layer {
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
            let mut o = GeometryOverride::default();
            for (fname, &n) in fields {
                let fpath = format!("{name}.{fname}");
                if n == 0 {
                    return Err(ModelError::config(&fpath, "expected a positive integer"));
                }
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
        Ok(out)
    }

    fn rope(
        raw: Option<BTreeMap<String, RawRope>>,
        p: &str,
    ) -> Result<(RopeConfig, RopeConfig), ModelError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn multimodal(edit: impl FnOnce(&mut Value)) -> Result<Gemma4TextConfig, String> {
        let mut root = json!({
            "model_type": "gemma4",
            "text_config": {
                "hidden_size": 8,
                "intermediate_size": 16,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "head_dim": 4,
            },
        });
        edit(&mut root);
        Gemma4TextConfig::from_json(&root)
            .map(|(cfg, _)| cfg)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn missing_and_wrong_typed_fields_are_named_by_their_path() {
        let err = multimodal(|r| r["text_config"]["num_hidden_layers"] = Value::Null).unwrap_err();
        assert_eq!(err, "config field text_config.num_hidden_layers: missing");
        let err = multimodal(|r| r["text_config"]["num_hidden_layers"] = json!("2")).unwrap_err();
        assert_eq!(
            err,
            "config field text_config.num_hidden_layers: invalid type: string \"2\", expected usize"
        );
        let err =
            multimodal(|r| r["text_config"]["per_layer_config"] = json!({"1": {"head_dim": 1.5}}))
                .unwrap_err();
        assert!(
            err.starts_with("config field text_config.per_layer_config.1.head_dim: invalid type"),
            "{err}"
        );
        let err = multimodal(|r| r["text_config"]["layer_types"] = json!(["full_attention", 1]))
            .unwrap_err();
        assert!(
            err.starts_with("config field text_config.layer_types[1]: invalid type"),
            "{err}"
        );
    }

    #[test]
    fn lenient_fields_read_as_before() {
        let cfg = multimodal(|r| {
            let text = &mut r["text_config"];
            text["rms_norm_eps"] = json!(1);
            text["sliding_window"] = Value::Null;
            text["tie_word_embeddings"] = json!(false);
            text["eos_token_id"] = json!([1, 106]);
            // Read only without per_layer_config.
            text["global_head_dim"] = json!("unused");
            text["per_layer_config"] = json!({"1": {"head_dim": 8}});
            r["tie_word_embeddings"] = json!("not a boolean");
            r["eos_token_id"] = json!([]);
        })
        .unwrap();
        assert_eq!(cfg.rms_norm_eps, 1.0);
        assert_eq!(cfg.sliding_window, 512);
        assert!(
            cfg.tie_word_embeddings,
            "a wrapper's non-boolean means the default"
        );
        assert_eq!(cfg.eos_token_ids, [1, 106]);
        assert_eq!(cfg.layers[1].head_dim, 8);

        let err = multimodal(|r| r["text_config"]["global_head_dim"] = json!("used")).unwrap_err();
        assert!(
            err.starts_with("config field text_config.global_head_dim: invalid type"),
            "{err}"
        );
    }
}
