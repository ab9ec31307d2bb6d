//! Text in and out through a checkpoint's tokenizer.json.

use std::path::Path;

use anyhow::{Context, Result};
use specd_core::stop::DetokenizeError;
use specd_core::Detokenizer;

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
}

impl TextTokenizer {
    /// Loads `tokenizer.json` from `dir`, if there is one.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Ok(None);
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
            .context("loading the tokenizer")?;
        Ok(Some(Self { inner }))
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, true)
            .map_err(|e| anyhow::anyhow!("encoding the prompt: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }
}

impl Detokenizer for TextTokenizer {
    fn decode(&self, ids: &[u32]) -> Result<String, DetokenizeError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| DetokenizeError(e.to_string()))
    }
}

/// Stands in for a tokenizer when a checkpoint has none: ids in, no text out.
pub struct NoText;

impl Detokenizer for NoText {
    fn decode(&self, _ids: &[u32]) -> Result<String, DetokenizeError> {
        Ok(String::new())
    }
}
