//! A constraint on the tokens a request may emit (a JSON schema, a regex, a grammar), as the
//! round loop drives it: the mask of every position the target samples, drafts checked
//! before they reach the verifier, and tokens the constraint forces proposed as free drafts.

use crate::sampling::TokenMask;

/// A constraint's state over the emitted tokens. The round loop advances it by every
/// emitted token, in order, and asks for masks ahead without moving it.
pub trait TokenConstraint: Send + Sync {
    /// The mask of the next position, after every committed token.
    fn next_mask(&mut self) -> Result<TokenMask, ConstraintError>;

    /// The masks of a verify block's rows: row 0 after the committed tokens, row `j` after
    /// `drafts[..j]` as well. Drafts are checked in order and the first one the constraint
    /// refuses ends the block there, so `masks.len() == kept + 1`. The state is as before
    /// when this returns.
    fn block_masks(&mut self, drafts: &[u32]) -> Result<BlockMasks, ConstraintError>;

    /// Advances by emitted tokens (each one allowed by its position's mask).
    fn commit(&mut self, tokens: &[u32]) -> Result<(), ConstraintError>;

    /// Up to `max` tokens that most likely follow whatever the model does (the constraint
    /// leaves one way on, as a field name or a closing bracket), for free drafts. The state
    /// is as before when this returns.
    fn forced(&mut self, max: usize) -> Vec<u32>;

    /// Whether the constraint is complete: nothing may follow but the end of the sequence
    /// (already emitted, or the only choice left).
    fn is_complete(&self) -> bool;
}

/// A verify block's masks and how many drafts the constraint let through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockMasks {
    /// Drafts kept, from the first.
    pub kept: usize,
    /// One mask per verify row (`kept + 1`).
    pub masks: Vec<TokenMask>,
}

/// The constraint failed (the model emitted a token it refuses, or it broke down).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("constraint: {0}")]
pub struct ConstraintError(pub String);
