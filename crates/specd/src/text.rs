//! The CLI's prompts through the target's text side ([`specd_text::TargetText`]): one user
//! message through the chat template, or raw text.

use std::path::Path;

use anyhow::{Context, Result};
use specd_text::{ChatMessage, TargetText};

/// The text side of a GGUF target (its tokenizer and chat template always exist).
pub fn gguf_text(path: &Path) -> Result<TargetText> {
    TargetText::from_gguf(path)
        .with_context(|| format!("loading the tokenizer of {}", path.display()))
}

/// The text side of a checkpoint directory, `None` when it has no tokenizer.json.
pub fn dir_text(dir: &Path) -> Result<Option<TargetText>> {
    let text = TargetText::from_dir(dir)
        .with_context(|| format!("reading the text files of {}", dir.display()))?;
    Ok(text.has_tokenizer().then_some(text))
}

pub trait PromptText {
    /// The prompt as the chat template renders one user message, ready for the reply.
    fn encode_user(&self, user: &str) -> Result<Vec<u32>>;
    /// The chat template's text for one user message, ready for the reply.
    fn render_user(&self, user: &str) -> Result<String>;
    /// The text as it is, through the tokenizer.
    fn encode_raw(&self, text: &str) -> Result<Vec<u32>>;
}

impl PromptText for TargetText {
    fn encode_user(&self, user: &str) -> Result<Vec<u32>> {
        Ok(self.encode_chat(&[ChatMessage::user(user)])?)
    }

    fn render_user(&self, user: &str) -> Result<String> {
        Ok(self.render_chat(&[ChatMessage::user(user)])?)
    }

    fn encode_raw(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.encode(text)?)
    }
}
