//! The set of tokens a constraint (a grammar) allows at one position.

use std::sync::Arc;

/// A bit per vocabulary id: bit `id % 32` of word `id / 32` is set when `id` is allowed.
///
/// Cloning shares the words: a mask travels from the constraint through the round loop to
/// the verifier's row without copying.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Arc<[u32]>,
}

impl TokenMask {
    /// A mask over these words (`ids` up to `32 * words.len()`).
    pub fn from_words(words: impl Into<Arc<[u32]>>) -> Self {
        Self {
            words: words.into(),
        }
    }

    /// A mask allowing exactly `ids` (out of `vocab_size`).
    pub fn allowing(vocab_size: usize, ids: &[u32]) -> Self {
        let mut words = vec![0u32; vocab_size.div_ceil(32)];
        for &id in ids {
            if let Some(word) = words.get_mut(id as usize / 32) {
                *word |= 1 << (id % 32);
            }
        }
        Self::from_words(words)
    }

    /// The words, little-endian bit order within each.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Whether `id` is allowed; ids past the mask are not.
    pub fn allows(&self, id: u32) -> bool {
        self.words
            .get(id as usize / 32)
            .is_some_and(|word| word & (1 << (id % 32)) != 0)
    }

    /// How many ids are allowed.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The one allowed id, when exactly one is.
    pub fn only(&self) -> Option<u32> {
        (self.count() == 1).then(|| self.ids().next()).flatten()
    }

    /// The allowed ids, ascending.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &word)| {
            (0..32u32)
                .filter(move |bit| word & (1 << bit) != 0)
                .map(move |bit| i as u32 * 32 + bit)
        })
    }

    /// Sets every disallowed logit to `-inf`. Fails when no logit stays allowed.
    pub fn apply(&self, logits: &mut [f32]) -> Result<(), EmptyMask> {
        let mut any = false;
        for (id, logit) in logits.iter_mut().enumerate() {
            if self.allows(id as u32) {
                any |= !logit.is_nan();
            } else {
                *logit = f32::NEG_INFINITY;
            }
        }
        if any {
            Ok(())
        } else {
            Err(EmptyMask)
        }
    }
}

impl std::fmt::Debug for TokenMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenMask({} allowed)", self.count())
    }
}

/// The mask allows no token of the vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the constraint allows no token of the vocabulary here")]
pub struct EmptyMask;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowing_sets_exactly_the_ids() {
        let mask = TokenMask::allowing(70, &[0, 31, 32, 69]);
        assert_eq!(mask.ids().collect::<Vec<_>>(), [0, 31, 32, 69]);
        assert!(mask.allows(31) && !mask.allows(30) && !mask.allows(1000));
        assert_eq!(mask.count(), 4);
        assert_eq!(mask.only(), None);
        assert_eq!(TokenMask::allowing(70, &[5]).only(), Some(5));
    }

    #[test]
    fn apply_masks_the_rest_and_refuses_an_empty_choice() {
        let mut logits = vec![1.0, 2.0, 3.0, 4.0];
        TokenMask::allowing(4, &[1, 3]).apply(&mut logits).unwrap();
        assert_eq!(logits, [f32::NEG_INFINITY, 2.0, f32::NEG_INFINITY, 4.0]);
        let mut logits = vec![1.0, 2.0];
        assert_eq!(
            TokenMask::allowing(4, &[3]).apply(&mut logits),
            Err(EmptyMask)
        );
    }
}
