//! Why a call on a prompt-lookup session failed (the n-gram and hybrid drafters keep one
//! per request).

use crate::ids::SessionId;

/// A call named a session wrongly, or its tokens do not continue the session.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// `draft` named a session that is not open.
    #[error("unknown session {0}")]
    UnknownSession(SessionId),
    /// `open` named a session that is already open.
    #[error("session {0} is already open")]
    SessionExists(SessionId),
    /// The request's `committed_len` disagrees with the tokens the session has seen.
    #[error(
        "invalid `committed_len` {committed_len} for session {session}: it holds {held} \
         tokens and was sent {sent} more"
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

/// A call to [`super::NgramDrafter`] failed; the request goes on without speculation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("ngram drafter: {0}")]
pub struct NgramDrafterError(#[from] pub SessionError);
