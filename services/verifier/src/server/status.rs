//! gRPC status codes for verifier failures.

use tonic::Status;

use crate::error::VerifierError;

/// The status a failed verifier call answers with. Input errors name their field; model and
/// tensor failures are the server's own (INTERNAL).
/// The gRPC status of a verifier error.
pub fn status_of(error: VerifierError) -> Status {
    let message = error.to_string();
    match error {
        VerifierError::UnknownSequence(_) => Status::not_found(message),
        VerifierError::DuplicateSequence(_) => Status::already_exists(message),
        VerifierError::InvalidArgument { .. } => Status::invalid_argument(message),
        VerifierError::OutOfRange { .. } => Status::out_of_range(message),
        VerifierError::ResourceExhausted(_) => Status::resource_exhausted(message),
        VerifierError::Model(_) | VerifierError::Tensor(_) | VerifierError::Forward(_) => {
            Status::internal(message)
        }
        VerifierError::Stopped => Status::unavailable(message),
    }
}

/// NOT_FOUND for a sequence id the server does not hold.
pub(crate) fn unknown_sequence(seq_id: &str) -> Status {
    Status::not_found(format!(
        "seq_id: unknown sequence {seq_id} (never created, released or expired)"
    ))
}

/// A blocking task panicked or was cancelled at shutdown.
pub(crate) fn join_failed(error: tokio::task::JoinError) -> Status {
    Status::internal(format!("verifier task failed: {error}"))
}
