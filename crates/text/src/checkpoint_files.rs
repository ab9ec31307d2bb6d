//! The text files of a Hugging Face checkpoint directory: `tokenizer.json`, the
//! end-of-sequence ids of `config.json` and `generation_config.json`, and the chat template
//! with its special tokens (`chat_template.jinja`, else `tokenizer_config.json`).

use std::path::Path;

use serde_json::Value;

use crate::error::{Result, TextError};

/// What a checkpoint directory says about text.
pub(crate) struct CheckpointFiles {
    pub tokenizer: Option<tokenizers::Tokenizer>,
    pub eos_token_ids: Vec<u32>,
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

impl CheckpointFiles {
    pub fn read(dir: &Path) -> Result<Self> {
        let config = read_json(&dir.join("config.json"))?
            .ok_or_else(|| TextError::io(&dir.join("config.json"), not_found()))?;
        let mut eos_token_ids = token_ids(&config, "eos_token_id");
        if eos_token_ids.is_empty() {
            if let Some(text_config) = config.get("text_config") {
                eos_token_ids = token_ids(text_config, "eos_token_id");
            }
        }
        // Generation stops where Hugging Face's generate stops: its generation config may
        // list more ids (a chat model's end of turn) than the model config.
        if let Some(generation) = read_json(&dir.join("generation_config.json"))? {
            eos_token_ids.extend(token_ids(&generation, "eos_token_id"));
        }
        eos_token_ids.sort_unstable();
        eos_token_ids.dedup();

        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = if tokenizer_path.is_file() {
            Some(
                tokenizers::Tokenizer::from_file(&tokenizer_path)
                    .map_err(|e| TextError::json(&tokenizer_path, e))?,
            )
        } else {
            None
        };

        let tokenizer_config_path = dir.join("tokenizer_config.json");
        let tokenizer_config = read_json(&tokenizer_config_path)?;
        let template_path = dir.join("chat_template.jinja");
        let chat_template = if template_path.is_file() {
            Some(
                std::fs::read_to_string(&template_path)
                    .map_err(|e| TextError::io(&template_path, e))?,
            )
        } else {
            match tokenizer_config
                .as_ref()
                .and_then(|c| c.get("chat_template"))
            {
                Some(value) => Some(template_source(value).ok_or_else(|| {
                    TextError::json(
                        &tokenizer_config_path,
                        "chat_template: expected a string or a list of {name, template} with \
                         a \"default\" entry",
                    )
                })?),
                None => None,
            }
        };
        let special = |name: &str| {
            tokenizer_config
                .as_ref()
                .and_then(|c| token_string(c.get(name)?))
        };
        Ok(Self {
            tokenizer,
            eos_token_ids,
            chat_template,
            bos_token: special("bos_token"),
            eos_token: special("eos_token"),
        })
    }
}

fn not_found() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::NotFound, "missing")
}

/// The JSON file at `path`, `None` when there is no such file.
fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| TextError::io(path, e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TextError::json(path, e))
}

fn token_ids(object: &Value, name: &str) -> Vec<u32> {
    let as_id = |v: &Value| v.as_u64().and_then(|id| u32::try_from(id).ok());
    match object.get(name) {
        Some(Value::Array(ids)) => ids.iter().filter_map(as_id).collect(),
        Some(value) => as_id(value).into_iter().collect(),
        None => Vec::new(),
    }
}

/// A special token as `tokenizer_config.json` writes it: a string or `{"content": ...}`.
fn token_string(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Object(object) => object.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// `chat_template` as a string, or the `default` one of a list of named templates.
fn template_source(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Array(named) => named
            .iter()
            .find(|entry| entry.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|entry| entry.get("template")?.as_str().map(str::to_owned)),
        _ => None,
    }
}
