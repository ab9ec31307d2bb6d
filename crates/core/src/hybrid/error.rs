//! Why a hybrid drafter call failed.

use crate::ids::SessionId;

/// A call to [`super::HybridDrafter`] failed; the request goes on without speculation.
#[derive(Debug, thiserror::Error)]
pub enum HybridDrafterError<E: std::error::Error + 'static> {
    /// The inner drafter failed.
    #[error("hybrid drafter: {0}")]
    Inner(#[source] E),
    /// `draft` named a session that is not open.
    #[error("hybrid drafter: unknown session {0}")]
    UnknownSession(SessionId),
    /// `open` named a session that is already open.
    #[error("hybrid drafter: session {0} is already open")]
    SessionExists(SessionId),
    /// The request's `committed_len` disagrees with the tokens the session has seen.
    #[error(
        "hybrid drafter: invalid `committed_len` {committed_len} for session {session}: \
         it holds {held} tokens and was sent {sent} more"
    )]
    CommittedLenMismatch {
        /// Session of the request.
        session: SessionId,
        /// The request's `committed_len`.
        committed_len: usize,
        /// Tokens the session held before the request.
        held: usize,
        /// Tokens the request's `committed_tokens` added.
        sent: usize,
    },
}
