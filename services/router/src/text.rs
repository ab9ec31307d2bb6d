//! The target's text side: tokenizer and end-of-sequence ids, read from its checkpoint
//! directory or from a GGUF file's metadata (the router never loads the model itself).

use std::path::Path;

use serde_json::Value;
use specd_core::stop::DetokenizeError;
use specd_core::Detokenizer;

/// Why the target's text files could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
}

fn file_error(path: &Path, reason: impl ToString) -> TextError {
    TextError::File {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Tokenizer (optional) and end-of-sequence ids of the target.
#[derive(Default)]
pub struct TargetText {
    tokenizer: Option<tokenizers::Tokenizer>,
    eos_token_ids: Vec<u32>,
    /// Leave special tokens (chat-turn markers, end of text) out of decoded text.
    skip_special_tokens: bool,
}

impl TargetText {
    /// Reads `tokenizer.json` (if present) and the end-of-sequence ids of `config.json`
    /// (top level, else `text_config`) from a checkpoint directory.
    pub fn from_dir(dir: &Path) -> Result<Self, TextError> {
        let config_path = dir.join("config.json");
        let config =
            std::fs::read_to_string(&config_path).map_err(|e| file_error(&config_path, e))?;
        let config: Value =
            serde_json::from_str(&config).map_err(|e| file_error(&config_path, e))?;
        let mut eos_token_ids = token_ids(&config, "eos_token_id");
        if eos_token_ids.is_empty() {
            if let Some(text_config) = config.get("text_config") {
                eos_token_ids = token_ids(text_config, "eos_token_id");
            }
        }
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = if tokenizer_path.is_file() {
            Some(
                tokenizers::Tokenizer::from_file(&tokenizer_path)
                    .map_err(|e| file_error(&tokenizer_path, e))?,
            )
        } else {
            None
        };
        Ok(Self {
            tokenizer,
            eos_token_ids,
            skip_special_tokens: false,
        })
    }

    /// The tokenizer and end-of-sequence ids of a Qwen2 GGUF model (`tokenizer.json` beside
    /// the file when present, else rebuilt from the GGUF metadata). Decoded text leaves out
    /// special tokens, as `specd generate` does for GGUF models.
    pub fn from_gguf(path: &Path) -> Result<Self, TextError> {
        let tokenizer = specd_models::qwen2::Qwen2Tokenizer::for_model(path)
            .map_err(|e| file_error(path, e))?;
        Ok(Self {
            eos_token_ids: tokenizer.eos_token_ids().to_vec(),
            tokenizer: Some(tokenizer.inner().clone()),
            skip_special_tokens: true,
        })
    }

    /// A target known only by its end-of-sequence ids (token-id clients only).
    pub fn without_tokenizer(eos_token_ids: Vec<u32>) -> Self {
        Self {
            tokenizer: None,
            eos_token_ids,
            skip_special_tokens: false,
        }
    }

    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn has_tokenizer(&self) -> bool {
        self.tokenizer.is_some()
    }

    /// Token ids of a text prompt, special tokens added as the tokenizer's post-processor
    /// specifies; `None` without a tokenizer.
    pub fn encode(&self, text: &str) -> Option<Result<Vec<u32>, String>> {
        let tokenizer = self.tokenizer.as_ref()?;
        Some(
            tokenizer
                .encode(text, true)
                .map(|encoding| encoding.get_ids().to_vec())
                .map_err(|e| e.to_string()),
        )
    }
}

/// Without a tokenizer every text is empty: token ids still flow.
impl Detokenizer for TargetText {
    fn decode(&self, ids: &[u32]) -> Result<String, DetokenizeError> {
        match &self.tokenizer {
            Some(tokenizer) => tokenizer
                .decode(ids, self.skip_special_tokens)
                .map_err(|e| DetokenizeError(e.to_string())),
            None => Ok(String::new()),
        }
    }
}

fn token_ids(object: &Value, name: &str) -> Vec<u32> {
    let as_id = |v: &Value| v.as_u64().and_then(|id| u32::try_from(id).ok());
    match object.get(name) {
        Some(Value::Array(ids)) => ids.iter().filter_map(as_id).collect(),
        Some(value) => as_id(value).into_iter().collect(),
        None => Vec::new(),
    }
}
