//! One request's grammar state, driven by the round loop through core's
//! [`TokenConstraint`].

use std::sync::Arc;

use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;
use specd_core::{BlockMasks, ConstraintError, TokenConstraint, TokenMask};

use crate::tokens::Shared;

/// The grammar state of one request's output, from [`crate::GrammarTokens::compile`].
///
/// An end-of-sequence token is never fed to llguidance: it ends the output, so the
/// constraint only records it (llguidance could take some EOS as part of a grammar,
/// which would leave drafts impossible to roll back by count).
pub struct GrammarConstraint {
    matcher: Matcher,
    shared: Arc<Shared>,
    /// The mask after the committed tokens, until the next commit: the round loop reads
    /// it for the next position and again as a verify block's first row.
    mask: Option<TokenMask>,
    /// An end-of-sequence token was committed: nothing may follow.
    ended: bool,
}

impl GrammarConstraint {
    /// The constraint in its start state, its first mask computed.
    pub(crate) fn start(matcher: Matcher, shared: Arc<Shared>) -> Result<Self, ConstraintError> {
        let mut constraint = Self {
            matcher,
            shared,
            mask: None,
            ended: false,
        };
        constraint.next_mask()?;
        Ok(constraint)
    }

    fn is_eos(&self, id: u32) -> bool {
        self.shared.eos_token_ids.contains(&id)
    }

    /// The grammar has nothing left but the end of the sequence (llguidance stops its
    /// matcher there). An error also stops it, and is not complete.
    fn grammar_done(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }

    fn broken(&self) -> Option<ConstraintError> {
        self.matcher.get_error().map(ConstraintError)
    }

    /// The mask of the matcher's state, or of the end of the sequence once `ended`.
    fn state_mask(&mut self, ended: bool) -> Result<TokenMask, ConstraintError> {
        if ended {
            return Ok(self.eos_mask());
        }
        if let Some(error) = self.broken() {
            return Err(error);
        }
        if self.grammar_done() {
            return Ok(self.eos_mask());
        }
        let vob = self
            .matcher
            .compute_mask()
            .map_err(|e| ConstraintError(e.to_string()))?;
        Ok(self.to_mask(&vob))
    }

    fn eos_mask(&self) -> TokenMask {
        TokenMask::allowing(self.shared.vocab_size, &self.shared.eos_token_ids)
    }

    /// llguidance's mask has our bit layout (bit `id % 32` of word `id / 32`) but may be
    /// longer than the vocabulary; it allows llguidance's EOS ids, and the model ends on
    /// any of its own, so one allowed means all are.
    fn to_mask(&self, vob: &SimpleVob) -> TokenMask {
        let vocab = self.shared.vocab_size;
        let mut words = vec![0u32; vocab.div_ceil(32)];
        for (word, &bits) in words.iter_mut().zip(vob.as_slice()) {
            *word = bits;
        }
        // The trie has the model's vocabulary, but a mask word may run past it.
        let tail_bits = vocab % 32;
        if tail_bits > 0 {
            if let Some(last) = words.last_mut() {
                *last &= (1u32 << tail_bits) - 1;
            }
        }
        let eos = &self.shared.eos_token_ids;
        let bit = |id: u32| (id as usize / 32, 1u32 << (id % 32));
        let allows = |words: &[u32], id: u32| {
            let (word, mask) = bit(id);
            words.get(word).is_some_and(|w| w & mask != 0)
        };
        if eos.iter().any(|&id| allows(&words, id)) {
            for &id in eos {
                let (word, mask) = bit(id);
                if let Some(word) = words.get_mut(word) {
                    *word |= mask;
                }
            }
        }
        TokenMask::from_words(words)
    }

    /// The masks of `drafts`' rows, leaving the matcher `consumed` tokens ahead; the
    /// caller rolls them back whatever this returns.
    fn walk_block(
        &mut self,
        drafts: &[u32],
        consumed: &mut usize,
    ) -> Result<BlockMasks, ConstraintError> {
        let mut masks = Vec::with_capacity(drafts.len() + 1);
        let mut ended = self.ended;
        let mut mask = self.next_mask()?;
        for (kept, &draft) in drafts.iter().enumerate() {
            if !mask.allows(draft) {
                masks.push(mask);
                return Ok(BlockMasks { kept, masks });
            }
            masks.push(mask);
            if ended || self.is_eos(draft) || self.grammar_done() {
                // Only an EOS is allowed past a complete grammar, and it ends the output.
                ended = true;
            } else {
                self.matcher
                    .consume_token(draft)
                    .map_err(|e| ConstraintError(format!("draft {draft}: {e}")))?;
                *consumed += 1;
            }
            mask = self.state_mask(ended)?;
        }
        masks.push(mask);
        Ok(BlockMasks {
            kept: drafts.len(),
            masks,
        })
    }
}

impl TokenConstraint for GrammarConstraint {
    fn next_mask(&mut self) -> Result<TokenMask, ConstraintError> {
        if let Some(mask) = &self.mask {
            return Ok(mask.clone());
        }
        let mask = self.state_mask(self.ended)?;
        self.mask = Some(mask.clone());
        Ok(mask)
    }

    fn block_masks(&mut self, drafts: &[u32]) -> Result<BlockMasks, ConstraintError> {
        let mut consumed = 0;
        let walked = self.walk_block(drafts, &mut consumed);
        // Rolled back even when the walk failed (the walk's error is the one to report):
        // a draft must not stay in the state the next commit sees.
        let rolled_back = match consumed {
            0 => Ok(()),
            _ => self
                .matcher
                .rollback(consumed)
                .map_err(|e| ConstraintError(format!("rolling back {consumed} drafts: {e}"))),
        };
        let masks = walked?;
        rolled_back?;
        Ok(masks)
    }

    fn commit(&mut self, tokens: &[u32]) -> Result<(), ConstraintError> {
        self.mask = None;
        for &token in tokens {
            if self.ended {
                if self.is_eos(token) {
                    continue;
                }
                return Err(ConstraintError(format!(
                    "token {token} after the end of the sequence"
                )));
            }
            if let Some(error) = self.broken() {
                return Err(error);
            }
            if self.is_eos(token) {
                let accepting = self.grammar_done()
                    || self
                        .matcher
                        .is_accepting()
                        .map_err(|e| ConstraintError(e.to_string()))?;
                if !accepting {
                    return Err(ConstraintError(format!(
                        "end of sequence {token} before the grammar is complete"
                    )));
                }
                self.ended = true;
                continue;
            }
            if self.grammar_done() {
                return Err(ConstraintError(format!(
                    "token {token} after the grammar is complete"
                )));
            }
            self.matcher
                .consume_token(token)
                .map_err(|e| ConstraintError(format!("token {token} refused: {e}")))?;
        }
        Ok(())
    }

    fn forced(&mut self, max: usize) -> Vec<u32> {
        if max == 0 || self.ended || self.matcher.is_stopped() {
            return Vec::new();
        }
        // Computing forced tokens does not move the matcher (it caches them for the
        // matcher's own use only).
        let mut forced = self.matcher.compute_ff_tokens();
        forced.truncate(max);
        forced
    }

    fn is_complete(&self) -> bool {
        if self.ended || self.grammar_done() {
            return true;
        }
        // Accepting with nothing but an EOS allowed: llguidance usually stops by itself
        // there, and the mask says so whenever it has been computed (EOS ids are allowed
        // all together or not at all, see `to_mask`).
        let eos = &self.shared.eos_token_ids;
        self.mask.as_ref().is_some_and(|mask| {
            eos.first().is_some_and(|&id| mask.allows(id)) && mask.count() == eos.len()
        })
    }
}

impl std::fmt::Debug for GrammarConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarConstraint")
            .field("ended", &self.ended)
            .field("stopped", &self.matcher.is_stopped())
            .field("error", &self.matcher.get_error())
            .finish_non_exhaustive()
    }
}
