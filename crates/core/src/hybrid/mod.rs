//! The `hybrid` drafter kind: prompt lookup when the context repeats, a model otherwise.
//!
//! Each draft call first looks the context (prompt, committed tokens, bonus) up in the
//! session's suffix index. A match of at least the lookup's `min_ngram` tokens (default
//! [`HYBRID_LOOKUP`]: 4) means the output is copying earlier text, where the copy is both
//! free and usually what the target writes, so its continuation is the round's drafts and
//! the inner drafter is not called. Anything shorter is a coincidence more often than not
//! (a common token, a bracket), so the round goes to the inner drafter (a draft model or an
//! MTP head). The inner session still learns every round it skipped: their carries and
//! committed tokens travel with the next request it gets.

mod drafter;
mod error;

pub use drafter::{HybridDrafter, HYBRID_LOOKUP, MAX_SKIPPED_ROUNDS};
pub use error::HybridDrafterError;
