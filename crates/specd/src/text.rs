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

/// Text through a GGUF model's own tokenizer and chat template.
pub struct GgufText {
    tokenizer: specd_models::qwen2::Qwen2Tokenizer,
    template: specd_models::qwen2::ChatTemplate,
}

impl GgufText {
    pub fn for_model(path: &Path) -> Result<Self> {
        use specd_models::qwen2::{ChatTemplate, GgufFile, Qwen2Tokenizer};
        let tokenizer = Qwen2Tokenizer::for_model(path)
            .with_context(|| format!("loading the tokenizer of {}", path.display()))?;
        let gguf = GgufFile::open(path)?;
        let template = match ChatTemplate::from_gguf_metadata(gguf.metadata()) {
            Ok(t) => t,
            Err(_) => ChatTemplate::qwen2_5()?,
        };
        Ok(Self {
            tokenizer,
            template,
        })
    }

    /// The prompt as the model's chat template renders one user message, ready for the reply.
    pub fn encode_chat(&self, user: &str) -> Result<Vec<u32>> {
        let text = self.render_chat(user)?;
        Ok(self.tokenizer.encode(&text)?)
    }

    /// The chat template's text for one user message, ready for the reply.
    pub fn render_chat(&self, user: &str) -> Result<String> {
        use specd_models::qwen2::ChatMessage;
        self.template
            .render(&[ChatMessage::user(user)], true)
            .context("rendering the chat template")
    }

    pub fn encode_raw(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.tokenizer.encode(text)?)
    }

    pub fn eos_token_ids(&self) -> Vec<u32> {
        self.tokenizer.eos_token_ids().to_vec()
    }
}

impl Detokenizer for GgufText {
    fn decode(&self, ids: &[u32]) -> Result<String, DetokenizeError> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| DetokenizeError(e.to_string()))
    }
}
