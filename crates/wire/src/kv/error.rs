//! Errors of the K/V transfer codecs; each names the field path it concerns.

use crate::tensor::TensorCodecError;

/// A snapshot stream or K/V delta that does not add up.
#[derive(Debug, thiserror::Error)]
pub enum KvWireError {
    /// A tensor or tensor spec is malformed.
    #[error(transparent)]
    Tensor(#[from] TensorCodecError),

    /// Tensors that must agree (K with V, rows with the committed length, full with sliding)
    /// do not.
    #[error("{field}: {reason}")]
    Inconsistent { field: String, reason: String },

    /// A chunk arrived where the stream order does not allow it.
    #[error("{field}: {reason}")]
    OutOfOrder { field: String, reason: String },

    /// A byte range does not continue where the previous one ended.
    #[error("{field}.byte_offset: expected {expected}, got {got}")]
    Offset {
        field: String,
        expected: u64,
        got: u64,
    },

    /// A byte range runs past the size its header declared.
    #[error("{field}.data: {got} bytes at offset {offset} overrun the {declared} bytes declared")]
    Overrun {
        field: String,
        offset: u64,
        got: usize,
        declared: usize,
    },

    /// The stream ended before every declared byte arrived.
    #[error("{field}: stream ended after {received} of {declared} bytes of {part}")]
    Incomplete {
        field: String,
        part: &'static str,
        received: usize,
        declared: usize,
    },

    /// The header declares more bytes than the receiver accepts for one snapshot.
    #[error("{field}: snapshot of {declared} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        field: String,
        declared: usize,
        limit: usize,
    },
}

impl KvWireError {
    /// The gRPC status to answer with: RESOURCE_EXHAUSTED for an oversized snapshot, the
    /// tensor codec's mapping for tensor errors, INVALID_ARGUMENT for the rest.
    pub fn into_status(self) -> tonic::Status {
        match self {
            Self::Tensor(err) => err.into_status(),
            Self::TooLarge { .. } => tonic::Status::resource_exhausted(self.to_string()),
            other => tonic::Status::invalid_argument(other.to_string()),
        }
    }
}

impl From<KvWireError> for tonic::Status {
    fn from(err: KvWireError) -> Self {
        err.into_status()
    }
}

pub(crate) fn inconsistent(field: &str, reason: impl Into<String>) -> KvWireError {
    KvWireError::Inconsistent {
        field: field.to_owned(),
        reason: reason.into(),
    }
}
