//! specd's text side, shared by the router and the CLI: tokenizers for both checkpoint kinds
//! (a Hugging Face `tokenizer.json`, or a GGUF's `tokenizer.ggml.*` metadata), the ids that end
//! a generation or a chat turn, and chat templates (minijinja, from the GGUF, the checkpoint's
//! `chat_template.jinja` or its `tokenizer_config.json`).
//!
//! [`TargetText`] is the one entry point; it implements core's [`specd_core::Detokenizer`],
//! which core's incremental detokenizer turns into text deltas as tokens arrive.

#![forbid(unsafe_code)]

mod chat_template;
mod checkpoint_files;
mod error;
mod gemma4_tokenizer;
pub mod gguf_metadata;
mod gguf_tokenizer;
mod target_text;
pub mod token_bytes;

pub use chat_template::{
    ChatMessage, ChatTemplate, TemplateVariables, QWEN2_5_CHAT_TEMPLATE, RENDERER_VARIABLES,
};
pub use error::{Result, TextError};
pub use gemma4_tokenizer::GEMMA4_STOP_TOKENS;
pub use gguf_metadata::{read_metadata, Metadata};
pub use gguf_tokenizer::{GgufTokenizer, QWEN2_SPLIT_REGEX, QWEN_STOP_TOKENS};
pub use target_text::{TargetText, END_OF_TURN_TOKENS};
pub use token_bytes::{Spelling, UnsupportedDecoder};
