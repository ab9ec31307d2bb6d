//! The `ngram` drafter kind: prompt-lookup decoding without any model.
//!
//! The context is the prompt, every committed token and the bonus. A suffix automaton over
//! it finds the context's longest suffix that occurred earlier, however long, and the drafts
//! are the tokens that followed that occurrence (the most recent one). The longer the match,
//! the more drafts it earns ([`NgramConfig`]). On repetitive text (code, quotes of the
//! prompt, edits of a given file, lists) they are often the target's own choices; elsewhere
//! nothing long matches and the round simply verifies fewer drafts. Where the round may
//! verify a token tree and the matched n-gram occurred more than once, what followed its
//! other occurrences branches off the chain. The drafter runs inside the router or embedded
//! process: it needs no carry and no drafter service.

mod automaton;
mod config;
mod continuation;
mod drafter;
mod edges;
mod error;
mod index;
mod lookup_tree;

pub use config::{NgramConfig, NgramConfigError, NGRAM_LIMIT};
pub use drafter::NgramDrafter;
pub use error::{NgramDrafterError, SessionError};
pub use index::{SuffixIndex, SuffixMatch};
