//! Verifier errors, each naming the request field or sequence at fault.

use specd_core::SeqId;

#[derive(Debug, thiserror::Error)]
pub enum VerifierError {
    #[error("seq {0:?}: unknown sequence")]
    UnknownSequence(SeqId),
    #[error("seq {0:?}: a sequence with this id already exists")]
    DuplicateSequence(SeqId),
    #[error("invalid argument {field}: {message}")]
    InvalidArgument { field: String, message: String },
    #[error("out of range {field}: {message}")]
    OutOfRange { field: String, message: String },
    #[error("resource exhausted: {0}")]
    ResourceExhausted(String),
    #[error("model: {0}")]
    Model(#[from] specd_models::ModelError),
    #[error("tensor: {0}")]
    Tensor(#[from] candle_core::Error),
    /// A batched forward failed; every row in it gets this error.
    #[error("batched forward: {0}")]
    Forward(String),
    #[error("the verifier's batch worker has stopped")]
    Stopped,
}

impl VerifierError {
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.to_string(),
            message: message.into(),
        }
    }

    pub fn out_of_range(field: &str, message: impl Into<String>) -> Self {
        Self::OutOfRange {
            field: field.to_string(),
            message: message.into(),
        }
    }
}
