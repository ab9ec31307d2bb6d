//! Errors of the model crate: every message names the tensor, field or file at fault.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("config field {field}: {message}")]
    Config { field: String, message: String },
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("tensor {name}: missing from the checkpoint")]
    MissingTensor { name: String },
    #[error("tensor {name}: expected shape {expected:?}, found {found:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Gguf(#[from] crate::qwen2::Qwen2Error),
    /// Boxed, as in [`crate::qwen2::Qwen2Error`].
    #[error(transparent)]
    GgufFile(Box<crate::gguf::GgufError>),
}

impl From<crate::gguf::GgufError> for ModelError {
    fn from(error: crate::gguf::GgufError) -> Self {
        Self::GgufFile(Box::new(error))
    }
}

impl ModelError {
    pub fn config(field: &str, message: impl Into<String>) -> Self {
        Self::Config {
            field: field.to_string(),
            message: message.into(),
        }
    }

    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
