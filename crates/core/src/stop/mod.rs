//! Stop conditions and incremental text output.

mod checker;
mod conditions;
mod detokenizer;
mod incremental;
#[cfg(test)]
mod test_pieces;

pub use checker::{StopChecker, TokenOutcome};
pub use conditions::{StopConditionError, StopConditions};
pub use detokenizer::{DetokenizeError, Detokenizer};
pub use incremental::IncrementalDecoder;
