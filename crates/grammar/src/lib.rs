//! Structured outputs for specd: a request's JSON schema, regex or Lark grammar as a
//! [`specd_core::TokenConstraint`], on top of llguidance.
//!
//! * [`GrammarTokens`]: a target model's vocabulary as llguidance needs it, built once per
//!   model (the bytes of every token in a trie).
//! * [`OutputFormat`]: what a request asks its output to be.
//! * [`GrammarTokens::compile`]: one request's [`GrammarConstraint`], within
//!   [`GrammarLimits`], or a [`GrammarError`] naming the part of the format at fault.

#![forbid(unsafe_code)]

mod constraint;
mod error;
mod format;
mod limits;
mod tok_env;
mod token_bytes;
mod tokens;

pub use constraint::GrammarConstraint;
pub use error::{GrammarError, GrammarErrorKind, VocabularyError};
pub use format::OutputFormat;
pub use limits::GrammarLimits;
pub use tokens::GrammarTokens;

#[cfg(test)]
mod tests {
    use super::*;

    fn shared<T: Send + Sync>() {}
    fn sendable<T: Send>() {}

    #[test]
    fn vocabularies_are_shared_across_threads_and_constraints_move_between_them() {
        shared::<GrammarTokens>();
        sendable::<GrammarConstraint>();
    }
}
