//! The `ngram` drafter kind: prompt-lookup decoding without any model.
//!
//! The drafts for a round are the tokens that followed the most recent earlier occurrence of
//! the context's longest suffix n-gram (the context being the prompt, every committed token
//! and the bonus). On repetitive text (code, quotes of the prompt, lists) they are often the
//! target's own choices; elsewhere nothing matches and the round simply verifies fewer drafts.
//! The drafter runs inside the router or embedded process: it needs no carry and no drafter
//! service.

mod config;
mod continuation;
mod drafter;
mod error;
mod index;

pub use config::{NgramConfig, NgramConfigError, NGRAM_LIMIT};
pub use drafter::NgramDrafter;
pub use error::NgramDrafterError;
pub use index::NgramIndex;
