//! Why a target's text side could not be read or used; each error names the file, field or
//! input at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a readable GGUF file: {message}")]
    Gguf { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Json { path: PathBuf, message: String },
    #[error("GGUF metadata field {field}: missing")]
    MissingField { field: String },
    #[error("GGUF metadata field {field}: {message}")]
    InvalidField { field: String, message: String },
    #[error("tokenizer: {context}: {message}")]
    Tokenizer { context: String, message: String },
    #[error("chat template: {0}")]
    Template(#[from] minijinja::Error),
    #[error("chat template variable {name}: {message}")]
    TemplateVariable { name: String, message: String },
    #[error("chat template: this target has none (no tokenizer.chat_template, chat_template.jinja or tokenizer_config.json chat_template)")]
    NoChatTemplate,
    #[error("no tokenizer: this target has no tokenizer.json and is not a GGUF file")]
    NoTokenizer,
}

pub type Result<T> = std::result::Result<T, TextError>;

impl TextError {
    pub(crate) fn field(field: &str, message: impl Into<String>) -> Self {
        Self::InvalidField {
            field: field.to_string(),
            message: message.into(),
        }
    }

    pub(crate) fn tokenizer(context: impl Into<String>, source: impl std::fmt::Display) -> Self {
        Self::Tokenizer {
            context: context.into(),
            message: source.to_string(),
        }
    }

    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn json(path: &std::path::Path, message: impl std::fmt::Display) -> Self {
        Self::Json {
            path: path.to_path_buf(),
            message: message.to_string(),
        }
    }
}
