//! Configuration of a Gemma 4 assistant (`model_type: gemma4_assistant`) and the check that it
//! fits a target.
//!
//! The assistant's `text_config` is a Gemma 4 text config in which every layer is KV-shared:
//! the layers have query projections only and read the target's K/V. Its geometry (layer kind,
//! head dim and KV heads per layer) is resolved by the target's parser with KV sharing switched
//! off, because the target's sharing rules need a producing layer and an assistant has none.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::config_json::{self, required};
use crate::error::ModelError;
use crate::gemma4::raw_config::{RawOuter, RawTextConfig};
use crate::gemma4::{Gemma4TextConfig, LayerKind};

/// The resolved assistant configuration.
#[derive(Debug, Clone)]
pub struct Gemma4AssistantConfig {
    /// The assistant's own text model: `hidden_size` is the drafter width `H_d`, and each
    /// layer's geometry is that of the target K/V it reads.
    pub text: Gemma4TextConfig,
    /// The target's hidden size `H_t` the assistant was trained with.
    pub backbone_hidden_size: usize,
    /// The LM head is the centroid ("ordered embeddings") head.
    pub use_ordered_embeddings: bool,
    pub num_centroids: usize,
    /// Clusters scored per step by the centroid head.
    pub centroid_intermediate_top_k: usize,
    /// The verify width the checkpoint suggests (drafts + 1), when it says.
    pub block_size: Option<usize>,
    pub tie_word_embeddings: bool,
}

/// The assistant's own top-level fields as written; null reads as absent.
#[derive(Deserialize)]
struct RawAssistant {
    backbone_hidden_size: Option<usize>,
    use_ordered_embeddings: Option<bool>,
    num_centroids: Option<usize>,
    centroid_intermediate_top_k: Option<usize>,
    block_size: Option<usize>,
    tie_word_embeddings: Option<bool>,
}

impl Gemma4AssistantConfig {
    /// Reads `config.json` from an assistant checkpoint directory.
    pub fn from_dir(dir: &Path) -> Result<Self, ModelError> {
        Self::from_json(&config_json::read(dir)?)
    }

    pub fn from_json(root: &Value) -> Result<Self, ModelError> {
        let model_type = required(config_json::model_type(root)?, "model_type")?;
        if model_type != "gemma4_assistant" {
            return Err(ModelError::config(
                "model_type",
                format!("expected gemma4_assistant, got {model_type:?}"),
            ));
        }
        let raw_text = root
            .get("text_config")
            .ok_or_else(|| ModelError::config("text_config", "missing (an object is required)"))?;
        let text = Self::text_config(
            config_json::parse(raw_text, "text_config.")?,
            config_json::parse(root, "")?,
        )?;

        let raw: RawAssistant = config_json::parse(root, "")?;
        let backbone_hidden_size = raw.backbone_hidden_size.unwrap_or(1536);
        let use_ordered_embeddings = raw.use_ordered_embeddings.unwrap_or(false);
        let num_centroids = raw.num_centroids.unwrap_or(2048);
        let top_k = raw.centroid_intermediate_top_k.unwrap_or(32);
        let block_size = raw.block_size;
        let tie_word_embeddings = raw.tie_word_embeddings.unwrap_or(true);
        if backbone_hidden_size == 0 {
            return Err(ModelError::config(
                "backbone_hidden_size",
                "must be positive",
            ));
        }
        if use_ordered_embeddings {
            if num_centroids == 0 || text.vocab_size % num_centroids != 0 {
                return Err(ModelError::config(
                    "num_centroids",
                    format!(
                        "{num_centroids} does not divide the vocabulary size {}",
                        text.vocab_size
                    ),
                ));
            }
            if top_k == 0 || top_k > num_centroids {
                return Err(ModelError::config(
                    "centroid_intermediate_top_k",
                    format!("{top_k} must lie in 1..={num_centroids} (num_centroids)"),
                ));
            }
        }
        if block_size == Some(0) {
            return Err(ModelError::config("block_size", "must be positive"));
        }
        Ok(Self {
            text,
            backbone_hidden_size,
            use_ordered_embeddings,
            num_centroids,
            centroid_intermediate_top_k: top_k,
            block_size,
            tie_word_embeddings,
        })
    }

    fn text_config(
        mut raw: RawTextConfig,
        outer: RawOuter,
    ) -> Result<Gemma4TextConfig, ModelError> {
        let p = "text_config.";
        // transformers' Gemma4TextConfig defaults to 256 when the key is absent.
        let ple = raw.hidden_size_per_layer_input.unwrap_or(256);
        if ple != 0 {
            return Err(ModelError::Unsupported(format!(
                "{p}hidden_size_per_layer_input: an assistant must not use per-layer embeddings (got {ple}{}; 0 is required)",
                if raw.hidden_size_per_layer_input.is_none() { ", the default when absent" } else { "" }
            )));
        }
        if raw.enable_moe_block.unwrap_or(false) {
            return Err(ModelError::Unsupported(format!(
                "{p}enable_moe_block: an assistant has no mixture-of-experts layers (must be false)"
            )));
        }
        if raw.use_double_wide_mlp.unwrap_or(false) {
            return Err(ModelError::Unsupported(format!(
                "{p}use_double_wide_mlp: not supported in an assistant (must be false)"
            )));
        }
        let layers = required(raw.num_hidden_layers, &format!("{p}num_hidden_layers"))?;
        // transformers turns 0 / absent into "every layer is shared" and rejects anything else.
        let shared = raw.num_kv_shared_layers.unwrap_or(0);
        if shared != 0 && shared != layers {
            return Err(ModelError::config(
                &format!("{p}num_kv_shared_layers"),
                format!("every assistant layer must be KV-shared: expected {layers}, got {shared}"),
            ));
        }
        raw.num_kv_shared_layers = Some(0);
        let mut text = Gemma4TextConfig::resolve(raw, Some(outer), p)?;
        text.num_kv_shared_layers = text.num_layers;
        Ok(text)
    }

    /// The drafter width `H_d`.
    pub fn hidden_size(&self) -> usize {
        self.text.hidden_size
    }

    /// Keys a sliding layer's query sees: transformers' assistant mask admits `W + 1` of them
    /// (the last committed position and the `W` before it).
    pub fn sliding_keys_visible(&self) -> usize {
        self.text.sliding_window + 1
    }

    /// Refuses a target whose hidden size, vocabulary or shared K/V geometry the assistant was
    /// not built for. Every message names both values.
    pub fn check_target(&self, target: &Gemma4TextConfig) -> Result<(), ModelError> {
        if self.backbone_hidden_size != target.hidden_size {
            return Err(ModelError::config(
                "backbone_hidden_size",
                format!(
                    "the drafter expects a target hidden size of {}, but the target's hidden_size is {}",
                    self.backbone_hidden_size, target.hidden_size
                ),
            ));
        }
        if self.text.vocab_size != target.vocab_size {
            return Err(ModelError::config(
                "text_config.vocab_size",
                format!(
                    "the drafter's vocabulary has {} tokens, the target's has {}",
                    self.text.vocab_size, target.vocab_size
                ),
            ));
        }
        for kind in [LayerKind::Sliding, LayerKind::Full] {
            let Some((index, mine)) = self
                .text
                .layers
                .iter()
                .enumerate()
                .find(|(_, l)| l.kind == kind)
            else {
                continue;
            };
            let Some(source) = target.last_kv_producer(kind) else {
                return Err(ModelError::config(
                    &format!("text_config.layer_types[{index}]"),
                    format!(
                        "the drafter has {} layers but the target has none that compute K/V",
                        kind.as_str()
                    ),
                ));
            };
            for (i, l) in self
                .text
                .layers
                .iter()
                .enumerate()
                .filter(|(_, l)| l.kind == kind)
            {
                if l.head_dim != mine.head_dim || l.num_kv_heads != mine.num_kv_heads {
                    return Err(ModelError::config(
                        "text_config.per_layer_config",
                        format!(
                            "drafter layers {index} and {i} ({}) disagree on their K/V geometry",
                            kind.as_str()
                        ),
                    ));
                }
            }
            let theirs = &target.layers[source];
            if theirs.head_dim != mine.head_dim || theirs.num_kv_heads != mine.num_kv_heads {
                return Err(ModelError::config(
                    "text_config.per_layer_config",
                    format!(
                        "the drafter's {} layers expect K/V of {} heads x {} dims, but the target's layer {source} \
                         (its last {} layer computing K/V) has {} heads x {} dims",
                        kind.as_str(),
                        mine.num_kv_heads,
                        mine.head_dim,
                        kind.as_str(),
                        theirs.num_kv_heads,
                        theirs.head_dim
                    ),
                ));
            }
        }
        Ok(())
    }
}
