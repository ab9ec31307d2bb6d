//! Why a request failed.

use super::request::RequestError;
use crate::constraint::ConstraintError;
use crate::stop::DetokenizeError;

/// A request failed. Drafter failures never end up here: they switch the request to plain
/// decoding instead.
#[derive(Debug, thiserror::Error)]
pub enum RoundLoopError<E: std::error::Error + 'static> {
    /// The request is invalid; nothing was sent to either side.
    #[error(transparent)]
    InvalidRequest(#[from] RequestError),
    /// A verifier call failed.
    #[error("verifier failed: {0}")]
    Verifier(#[source] E),
    /// The verifier's answer contradicts the request (a protocol violation).
    #[error("verifier answer to round {round} is invalid: {reason}")]
    InvalidVerifyAnswer {
        /// Round of the answer.
        round: u32,
        /// What is inconsistent.
        reason: String,
    },
    /// Emitted tokens could not be turned into text.
    #[error(transparent)]
    Detokenize(#[from] DetokenizeError),
    /// The output constraint failed (it refused a token the verifier sampled under its
    /// mask, or broke down).
    #[error(transparent)]
    Constraint(#[from] ConstraintError),
}
