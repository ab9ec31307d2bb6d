//! Why a hybrid drafter call failed.

use crate::ngram::SessionError;

/// A call to [`super::HybridDrafter`] failed; the request goes on without speculation.
#[derive(Debug, thiserror::Error)]
pub enum HybridDrafterError<E: std::error::Error + 'static> {
    /// The inner drafter failed.
    #[error("hybrid drafter: {0}")]
    Inner(#[source] E),
    /// The lookup session was named wrongly or not continued.
    #[error("hybrid drafter: {0}")]
    Session(#[from] SessionError),
}
