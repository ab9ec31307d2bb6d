//! A session's token history with an incrementally maintained n-gram index.

use std::collections::HashMap;

use super::config::NgramConfig;
use super::continuation::continuation;

/// The tokens of one sequence and, for every n-gram length in the configured range, where
/// each n-gram last ended.
///
/// Appending a token updates one entry per length, so drafting costs the same at any context
/// length: no round rescans the history.
#[derive(Clone, Debug)]
pub struct NgramIndex {
    config: NgramConfig,
    tokens: Vec<u32>,
    /// `last_end[n - min_ngram][gram]`: the largest `end` with `tokens[end - n..end] == gram`.
    last_end: Vec<HashMap<Box<[u32]>, usize>>,
}

/// Where a suffix n-gram of the context occurred before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Match {
    /// Position after the earlier occurrence: its first follower.
    end: usize,
}

impl NgramIndex {
    /// An empty index over n-grams of `config`'s lengths (validate `config` first).
    pub fn new(config: NgramConfig) -> Self {
        let lengths = config.max_ngram.saturating_sub(config.min_ngram) + 1;
        Self {
            config,
            tokens: Vec::new(),
            last_end: vec![HashMap::new(); lengths],
        }
    }

    /// The tokens appended so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Appends `tokens`, indexing every n-gram that ends in them.
    pub fn extend(&mut self, tokens: &[u32]) {
        self.tokens.reserve(tokens.len());
        for &token in tokens {
            self.tokens.push(token);
            let end = self.tokens.len();
            for (slot, n) in (self.config.min_ngram..=self.config.max_ngram).enumerate() {
                let Some(start) = end.checked_sub(n) else {
                    break;
                };
                let gram = &self.tokens[start..end];
                let Some(map) = self.last_end.get_mut(slot) else {
                    break;
                };
                match map.get_mut(gram) {
                    Some(last) => *last = end,
                    None => {
                        map.insert(gram.into(), end);
                    }
                }
            }
        }
    }

    /// Up to `count` drafts after `bonus`, the token that follows the appended ones.
    ///
    /// The context is the appended tokens then `bonus`. Its longest suffix n-gram (from
    /// `max_ngram` down to `min_ngram`) that occurred earlier selects the most recent such
    /// occurrence, and the drafts are the tokens that followed it (see
    /// `continuation` for reads past the end). Empty when no suffix occurred before.
    pub fn propose(&self, bonus: u32, count: usize) -> Vec<u32> {
        if count == 0 {
            return Vec::new();
        }
        match self.longest_match(bonus) {
            Some(found) => continuation(&self.tokens, bonus, found.end, count),
            None => Vec::new(),
        }
    }

    /// The most recent earlier occurrence of the longest matching suffix of
    /// `tokens ++ [bonus]`.
    ///
    /// Every indexed n-gram lies inside `tokens`, so it ends before the bonus and is never
    /// the suffix itself.
    fn longest_match(&self, bonus: u32) -> Option<Match> {
        let mut key = Vec::with_capacity(self.config.max_ngram);
        for n in self.config.lengths_longest_first() {
            let Some(start) = (self.tokens.len() + 1).checked_sub(n) else {
                continue;
            };
            key.clear();
            key.extend_from_slice(&self.tokens[start..]);
            key.push(bonus);
            let map = self.last_end.get(n - self.config.min_ngram)?;
            if let Some(&end) = map.get(key.as_slice()) {
                return Some(Match { end });
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::mix64;

    fn index(min_ngram: usize, max_ngram: usize, tokens: &[u32]) -> NgramIndex {
        let mut index = NgramIndex::new(NgramConfig {
            min_ngram,
            max_ngram,
        });
        index.extend(tokens);
        index
    }

    #[test]
    fn longest_ngram_wins() {
        // Suffix "1 2 3": the 1-gram "3" last occurred at 8 (followed by 9), but the 3-gram
        // "1 2 3" occurred at 0 (followed by 4 5).
        let tokens = [1, 2, 3, 4, 5, 6, 7, 3, 9, 1, 2];
        assert_eq!(index(1, 3, &tokens).propose(3, 2), [4, 5]);
        // Limited to 1-grams, the most recent "3" wins.
        assert_eq!(index(1, 1, &tokens).propose(3, 2), [9, 1]);
        // Limited to 2-grams, "2 3" also points at 0.
        assert_eq!(index(2, 2, &tokens).propose(3, 2), [4, 5]);
    }

    #[test]
    fn most_recent_occurrence_wins() {
        // The suffix "0 7 8" occurs twice before; the later occurrence is followed by 2.
        let tokens = [7, 8, 1, 0, 7, 8, 2, 0, 7];
        assert_eq!(index(1, 3, &tokens).propose(8, 1), [2]);
        // Extending the history moves the match to the newer occurrence.
        let mut grown = index(1, 3, &tokens);
        grown.extend(&[8, 5, 0, 7]);
        assert_eq!(grown.propose(8, 1), [5]);
    }

    #[test]
    fn no_match_gives_no_drafts() {
        assert!(index(1, 3, &[1, 2, 3]).propose(4, 5).is_empty());
        assert!(index(1, 3, &[]).propose(4, 5).is_empty());
        // The suffix must be at least min_ngram long and occur earlier.
        assert!(index(2, 3, &[5, 6, 7]).propose(5, 3).is_empty());
        assert_eq!(index(1, 3, &[5, 6, 7]).propose(5, 3), [6, 7, 5]);
    }

    #[test]
    fn count_cuts_the_drafts() {
        let tokens = [1, 2, 3, 4, 5, 6, 1];
        let index = index(1, 3, &tokens);
        assert_eq!(index.propose(2, 3), [3, 4, 5]);
        assert_eq!(index.propose(2, 1), [3]);
        assert!(index.propose(2, 0).is_empty());
    }

    #[test]
    fn match_near_the_end_continues_the_period() {
        assert_eq!(
            index(1, 3, &[4, 5, 6, 4, 5]).propose(6, 6),
            [4, 5, 6, 4, 5, 6]
        );
    }

    /// The definition, read off the whole context every time.
    fn brute_force(config: NgramConfig, history: &[u32], bonus: u32, count: usize) -> Vec<u32> {
        let mut context = history.to_vec();
        context.push(bonus);
        let len = context.len();
        for n in (config.min_ngram..=config.max_ngram).rev() {
            if n > len {
                continue;
            }
            let suffix = &context[len - n..];
            let found = (n..len).rev().find(|&end| &context[end - n..end] == suffix);
            if let Some(end) = found {
                let mut drafts = Vec::new();
                while drafts.len() < count.min(len) {
                    let position = end + drafts.len();
                    let token = if position < len {
                        context[position]
                    } else {
                        drafts[position - len]
                    };
                    drafts.push(token);
                }
                return drafts;
            }
        }
        Vec::new()
    }

    #[test]
    fn incremental_index_equals_a_brute_force_scan() {
        let mut state = 0x5EED_u64;
        let mut next = |bound: u64| {
            state = mix64(state.wrapping_add(0x9E37_79B9_7F4A_7C15));
            state % bound
        };
        for trial in 0..60 {
            let vocab = 2 + next(6);
            let config = NgramConfig {
                min_ngram: 1 + next(3) as usize,
                max_ngram: 0,
            };
            let config = NgramConfig {
                max_ngram: config.min_ngram + next(4) as usize,
                ..config
            };
            let mut index = NgramIndex::new(config);
            let mut history = Vec::new();
            let mut matched = 0;
            for _ in 0..40 {
                let chunk: Vec<u32> = (0..next(5)).map(|_| next(vocab) as u32).collect();
                index.extend(&chunk);
                history.extend_from_slice(&chunk);
                assert_eq!(index.tokens(), history.as_slice());
                let bonus = next(vocab) as u32;
                let count = next(9) as usize;
                let drafts = index.propose(bonus, count);
                let expected = brute_force(config, &history, bonus, count);
                assert_eq!(
                    drafts, expected,
                    "trial {trial} {config:?} history {history:?} bonus {bonus} count {count}"
                );
                matched += usize::from(!drafts.is_empty());
            }
            assert!(matched > 0, "trial {trial} never matched");
        }
    }
}
