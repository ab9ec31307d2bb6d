//! Errors of reading a GGUF file; each names the file or tensor at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a readable GGUF file: {source}")]
    Unreadable {
        path: PathBuf,
        source: candle_core::Error,
    },
    #[error("GGUF tensor {name}: missing")]
    MissingTensor { name: String },
    #[error("GGUF tensor {name}: expected shape {expected:?}, found {found:?}")]
    TensorShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("GGUF tensor {name}: cannot load: {source}")]
    TensorLoad {
        name: String,
        source: candle_core::Error,
    },
}

pub type Result<T> = std::result::Result<T, GgufError>;
