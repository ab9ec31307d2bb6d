//! The fields of a Gemma 4 text `config.json` as written, before defaults and checks.
//!
//! Every field is optional and null reads as absent; defaults, "missing" errors and range
//! checks belong to the resolution in `config.rs`.

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Value;

use super::config::LayerKind;

#[derive(Deserialize)]
pub(crate) struct RawTextConfig {
    pub enable_moe_block: Option<bool>,
    pub num_experts: Option<usize>,
    pub top_k_experts: Option<usize>,
    pub moe_intermediate_size: Option<usize>,
    pub use_bidirectional_attention: Option<String>,
    pub hidden_activation: Option<String>,
    pub vocab_size: Option<usize>,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub attention_k_eq_v: Option<bool>,
    pub num_kv_shared_layers: Option<usize>,
    pub use_double_wide_mlp: Option<bool>,
    pub hidden_size_per_layer_input: Option<usize>,
    pub layer_types: Option<Vec<LayerKind>>,
    /// Keys stay strings and fields a map so that a key that is not a layer index, and a field
    /// that cannot be overridden, are refused by name when resolved.
    pub per_layer_config: Option<BTreeMap<String, BTreeMap<String, usize>>>,
    /// Kept as written: read only without `per_layer_config`, so a malformed value is an
    /// error only then.
    pub global_head_dim: Option<Value>,
    pub num_global_key_value_heads: Option<Value>,
    pub rope_parameters: Option<BTreeMap<String, RawRope>>,
    pub rms_norm_eps: Option<f64>,
    pub sliding_window: Option<usize>,
    pub final_logit_softcapping: Option<f64>,
    pub attention_bias: Option<bool>,
    pub vocab_size_per_layer_input: Option<usize>,
    pub max_position_embeddings: Option<usize>,
    pub bos_token_id: Option<u32>,
    #[serde(default)]
    pub tie_word_embeddings: LooseBool,
    pub eos_token_id: Option<TokenIds>,
}

/// What a multimodal or assistant wrapper sets over its `text_config`.
#[derive(Deserialize)]
pub(crate) struct RawOuter {
    #[serde(default)]
    pub tie_word_embeddings: LooseBool,
    pub eos_token_id: Option<TokenIds>,
}

#[derive(Deserialize)]
pub(crate) struct RawRope {
    pub rope_type: Option<String>,
    pub rope_theta: Option<f64>,
    pub partial_rotary_factor: Option<f64>,
    pub factor: Option<f64>,
}

/// `tie_word_embeddings` is lenient: any value but a boolean, null included, means the default,
/// and a wrapper that sets the key at all takes precedence over its `text_config`.
#[derive(Default, Deserialize)]
#[serde(untagged)]
pub(crate) enum LooseBool {
    #[default]
    #[serde(skip)]
    Absent,
    Bool(bool),
    Other(IgnoredAny),
}

/// `eos_token_id`: one id or a list of them.
#[derive(Deserialize)]
#[serde(untagged, expecting = "expected a token id or a list of token ids")]
pub(crate) enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    pub fn into_vec(ids: Option<Self>) -> Vec<u32> {
        match ids {
            None => Vec::new(),
            Some(Self::One(id)) => vec![id],
            Some(Self::Many(ids)) => ids,
        }
    }
}
