//! Gemma 4 assistants (MTP drafters) from GGUF files in the layout llama.cpp's converter writes
//! for them (`general.architecture = gemma4-assistant`).
//!
//! The metadata is a Gemma 4 text model's under the `gemma4-assistant.` prefix, every layer
//! KV-shared, plus `embedding_length_out` (the target's hidden size, `backbone_hidden_size`) and
//! `nextn_predict_layers` (the layer count again). The tensors keep the target's names (an
//! assistant layer has no `attn_k` / `attn_v`); the projections are `nextn.pre_projection` and
//! `nextn.post_projection`, and `token_embd` is the assistant's own table, its tied LM head.
//! What differs from the target's reading:
//!
//! - the layers' KV head counts are `attention.head_count_kv`, since no key projection is left
//!   to count them by; they describe the target K/V the layers read, which the target check
//!   compares with the target's own;
//! - `attention_k_eq_v` is not recorded (an assistant computes no K/V) and reads as false.
//!
//! The converter drops every `masked_embedding.*` tensor and writes nothing in their place, so a
//! centroid ("ordered embeddings") assistant becomes a file that is indistinguishable from a
//! dense-head one, and runs, as in llama.cpp, with the dense head over the whole vocabulary
//! (drafts that may differ from transformers' centroid head; speculation stays lossless). A file
//! that does carry the centroid tensors (`masked_embd_centroids.weight`,
//! `masked_embd_ordering`, the names llama.cpp's loader knows and ignores) is refused: no key
//! records how many clusters the head scores per step, so it could not run as transformers runs
//! it.

use super::meta::Meta;
use super::*;

/// `general.architecture` of a Gemma 4 assistant in llama.cpp's naming.
pub const ASSISTANT_ARCHITECTURE: &str = "gemma4-assistant";

/// The centroid head's tensors in llama.cpp's naming.
const CENTROID_TENSORS: [&str; 2] = ["masked_embd_centroids.weight", "masked_embd_ordering"];

/// Opens a Gemma 4 assistant GGUF file: its configuration as the `config.json` of a
/// `gemma4_assistant` checkpoint, and its tensors under the checkpoint's names, converted to
/// `dtype` on `device` when loaded.
pub fn open_assistant(path: &Path, dtype: DType, device: &Device) -> Result<(Json, Checkpoint)> {
    let store = GgufStore {
        file: GgufFile::open(path)?,
    };
    let config = store.assistant_config_json()?;
    Ok((
        config,
        Checkpoint::from_store(Box::new(store), dtype, device),
    ))
}

impl GgufStore {
    fn assistant_config_json(&self) -> Result<Json> {
        const WHAT: &str = "a Gemma 4 assistant (MTP drafter)";
        let meta = Meta(self.file.metadata());
        let arch = meta.string("general.architecture")?;
        if arch != ASSISTANT_ARCHITECTURE {
            return Err(ModelError::config(
                "general.architecture",
                format!("expected {ASSISTANT_ARCHITECTURE:?} ({WHAT}), found {arch:?}"),
            ));
        }
        let path = self.file.path().display();
        if let Some(name) = CENTROID_TENSORS.iter().find(|n| self.file.has_tensor(n)) {
            return Err(ModelError::Unsupported(format!(
                "{path}: tensor {name}: a centroid (ordered embeddings) LM head, which no GGUF \
                 metadata describes fully (how many clusters it scores per step is not \
                 recorded); load the assistant's safetensors checkpoint instead"
            )));
        }
        let key = |k: &str| format!("{ASSISTANT_ARCHITECTURE}.{k}");
        let layers = meta.usize(&key("block_count"))?;
        // Checked first: the text reading would take unshared layers for a target's and ask
        // for their key projections.
        for k in ["attention.shared_kv_layers", "nextn_predict_layers"] {
            let found = meta.usize(&key(k))?;
            if found != layers {
                return Err(ModelError::config(
                    &key(k),
                    format!(
                        "{found}, but every one of the assistant's {layers} layers reads the \
                         target's K/V"
                    ),
                ));
            }
        }
        let mut text = self.text_config_json(ASSISTANT_ARCHITECTURE, WHAT)?;
        let kv_heads = meta.per_layer(&key("attention.head_count_kv"), layers)?;
        let Json::Object(fields) = &mut text else {
            return Err(ModelError::Invalid(format!(
                "{path}: the rebuilt text configuration is not an object"
            )));
        };
        if let Some(Json::Object(per_layer)) = fields.get_mut("per_layer_config") {
            for (i, heads) in kv_heads.iter().enumerate() {
                if let Some(Json::Object(layer)) = per_layer.get_mut(&i.to_string()) {
                    layer.insert("num_key_value_heads".into(), json!(heads));
                }
            }
        }
        let sliding = fields
            .get("layer_types")
            .and_then(Json::as_array)
            .and_then(|types| types.iter().position(|t| t == "sliding_attention"))
            .unwrap_or(0);
        if let Some(&heads) = kv_heads.get(sliding) {
            fields.insert("num_key_value_heads".into(), json!(heads));
        }
        let tied = fields
            .get("tie_word_embeddings")
            .cloned()
            .unwrap_or(json!(true));
        Ok(json!({
            "model_type": "gemma4_assistant",
            "backbone_hidden_size": meta.usize(&key("embedding_length_out"))?,
            "use_ordered_embeddings": false,
            "tie_word_embeddings": tied,
            "text_config": text,
        }))
    }
}
