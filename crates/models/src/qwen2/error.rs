//! Errors of the Qwen2 model; each names the file, field or tensor at fault.

use candle_core::quantized::GgmlDType;

#[derive(Debug, thiserror::Error)]
pub enum Qwen2Error {
    #[error("GGUF metadata field {field}: missing")]
    MissingField { field: String },
    #[error("GGUF metadata field {field}: {message}")]
    InvalidField { field: String, message: String },
    #[error("GGUF tensor {name}: cannot requantize {from:?} to Q8_0: {source}")]
    Requantize {
        name: String,
        from: GgmlDType,
        source: candle_core::Error,
    },
    #[error("rows[{row}].tokens: the block is empty")]
    EmptyBlock { row: usize },
    #[error(
        "rows[{row}].tokens[{index}]: id {id} is outside the vocabulary of {vocab_size} tokens"
    )]
    TokenOutOfRange {
        row: usize,
        index: usize,
        id: u32,
        vocab_size: usize,
    },
    #[error("rows[{row}]: {needed} positions exceed the context length {context_length}")]
    ContextOverflow {
        row: usize,
        needed: usize,
        context_length: usize,
    },
    #[error("truncate: cannot keep {requested} tokens, the cache holds {len}")]
    TruncateBeyondLength { requested: usize, len: usize },
    #[error("rows[{row}]: KV cache does not fit this model: {message}")]
    CacheMismatch { row: usize, message: String },
    #[error("rows[{row}].parents: {message}")]
    Tree { row: usize, message: String },
    #[error("hidden: expected [n, {hidden_size}] states, found {found:?}")]
    HiddenShape {
        hidden_size: usize,
        found: Vec<usize>,
    },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// Boxed: a file error is rare and would widen every result of the model.
    #[error(transparent)]
    File(Box<crate::gguf::GgufError>),
}

impl From<crate::gguf::GgufError> for Qwen2Error {
    fn from(error: crate::gguf::GgufError) -> Self {
        Self::File(Box::new(error))
    }
}

pub type Result<T> = std::result::Result<T, Qwen2Error>;

impl Qwen2Error {
    pub(crate) fn field(field: &str, message: impl Into<String>) -> Self {
        Self::InvalidField {
            field: field.to_string(),
            message: message.into(),
        }
    }
}
