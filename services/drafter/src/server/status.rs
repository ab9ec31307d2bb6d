//! gRPC status codes for drafter failures.

use tonic::Status;

use crate::engine::EngineError;

pub(crate) fn status_of(error: EngineError) -> Status {
    let message = error.to_string();
    match error {
        EngineError::InvalidInput { .. } => Status::invalid_argument(message),
        EngineError::Mismatch { .. } => Status::failed_precondition(message),
        EngineError::Internal(_) => Status::internal(message),
    }
}

pub(crate) fn unknown_session(session_id: &str) -> Status {
    Status::not_found(format!(
        "session_id: unknown session {session_id} (never opened, closed or expired)"
    ))
}

pub(crate) fn join_failed(error: tokio::task::JoinError) -> Status {
    Status::internal(format!("drafter task failed: {error}"))
}
