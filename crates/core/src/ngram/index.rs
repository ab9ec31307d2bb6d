//! A session's token history with an incrementally maintained suffix index.

use super::automaton::SuffixAutomaton;
use super::config::NgramConfig;
use super::continuation::continuation;
use super::error::SessionError;
use crate::ids::SessionId;

/// The tokens of one sequence and a suffix automaton over all of them.
///
/// Appending a token costs amortised O(1), and finding the longest earlier occurrence of the
/// context's suffix costs about what appending the next token will, so no round rescans the
/// history however long the match or the context.
#[derive(Clone, Debug, Default)]
pub struct SuffixIndex {
    tokens: Vec<u32>,
    automaton: SuffixAutomaton,
}

/// The longest suffix of a context (the indexed tokens and a bonus) that occurred earlier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuffixMatch {
    /// Length of the matched suffix, the bonus included; not capped.
    pub len: usize,
    /// Position in the context just after the earlier occurrence (the most recent one, but
    /// for the short strings of a long repetition an older one): its first follower, at most
    /// the number of indexed tokens.
    pub end: usize,
}

impl SuffixIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// The tokens appended so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Appends the tokens a round committed when they bring the index to `committed_len`;
    /// otherwise leaves it as it is and returns how many tokens it holds.
    pub fn append_committed(
        &mut self,
        committed: &[u32],
        committed_len: usize,
    ) -> Result<(), usize> {
        let held = self.tokens.len();
        if held.checked_add(committed.len()) != Some(committed_len) {
            return Err(held);
        }
        self.extend(committed);
        Ok(())
    }

    /// [`Self::append_committed`] for `session`'s round: the tokens its request committed
    /// bring the index to the request's `committed_len`, or it is told why not.
    pub fn append_round(
        &mut self,
        session: SessionId,
        committed: &[u32],
        committed_len: usize,
    ) -> Result<(), SessionError> {
        self.append_committed(committed, committed_len)
            .map_err(|held| SessionError::CommittedLenMismatch {
                session,
                committed_len,
                held,
                sent: committed.len(),
            })
    }

    /// Appends `tokens`.
    ///
    /// Past 2^31 or so tokens (far beyond any context) the automaton stops growing and
    /// lookups find nothing: a suffix of the indexed prefix would not be one of the context.
    pub fn extend(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
        for &token in tokens {
            if !self.automaton.push_token(token) {
                break;
            }
        }
    }

    /// The longest suffix of `tokens ++ [bonus]` that ends earlier in that context, and
    /// where; `None` when `bonus` never occurred (or the index is full).
    pub fn longest_match(&self, bonus: u32) -> Option<SuffixMatch> {
        if self.automaton.len() != self.tokens.len() {
            return None;
        }
        self.automaton
            .longest_match(bonus)
            .map(|found| SuffixMatch {
                len: found.len,
                end: found.end,
            })
    }

    /// Up to `count` tokens that followed `found`'s occurrence in `tokens ++ [bonus]`; past
    /// the end of the context they repeat the period they have just proposed.
    pub fn continuation(&self, bonus: u32, found: SuffixMatch, count: usize) -> Vec<u32> {
        continuation(&self.tokens, bonus, found.end, count)
    }

    /// The drafts after `bonus`: the continuation of the longest match, as many as `config`
    /// allows a match of its length (see [`NgramConfig`]) and at most `count`. Empty when
    /// nothing long enough matched.
    pub fn propose(&self, bonus: u32, count: usize, config: &NgramConfig) -> Vec<u32> {
        self.lookup(bonus, count, config)
            .map_or_else(Vec::new, |(_, drafts)| drafts)
    }

    /// [`Self::propose`] with the match it drew from; `None` when it drafts nothing.
    pub fn lookup(
        &self,
        bonus: u32,
        count: usize,
        config: &NgramConfig,
    ) -> Option<(SuffixMatch, Vec<u32>)> {
        let found = self.longest_match(bonus)?;
        let limit = config.draft_limit(found.len, count);
        if limit == 0 {
            return None;
        }
        Some((found, self.continuation(bonus, found, limit)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::mix64;

    /// Every match may draft the full count.
    const FLAT: NgramConfig = NgramConfig {
        min_ngram: 1,
        max_ngram: 1,
    };

    fn index(tokens: &[u32]) -> SuffixIndex {
        let mut index = SuffixIndex::new();
        index.extend(tokens);
        index
    }

    #[test]
    fn longest_match_beats_a_shorter_more_recent_one() {
        // Suffix "1 2 3": "3" last occurred at 7 (followed by 9), "2 3" nowhere else, but
        // "1 2 3" at 0..3 (followed by 4 5).
        let tokens = [1, 2, 3, 4, 5, 6, 7, 3, 9, 1, 2];
        let index = index(&tokens);
        assert_eq!(index.longest_match(3), Some(SuffixMatch { len: 3, end: 3 }));
        assert_eq!(index.propose(3, 2, &FLAT), [4, 5]);
    }

    #[test]
    fn matches_are_not_capped_in_length() {
        // A 20-token block, an unrelated stretch with a more recent copy of its last 5
        // tokens, then the block again: the 20-token match wins over the recent 5-token one.
        let block: Vec<u32> = (100..120).collect();
        let mut tokens = block.clone();
        tokens.extend([7, 8, 9]);
        tokens.extend(&block[15..]);
        tokens.push(50);
        tokens.extend(&block[..19]);
        // The recent copy: 115..=119 then 50.
        assert_eq!(tokens[23..29], [115, 116, 117, 118, 119, 50]);
        let index = index(&tokens);
        let found = index.longest_match(block[19]).unwrap();
        assert_eq!(found, SuffixMatch { len: 20, end: 20 });
        assert_eq!(index.propose(block[19], 3, &FLAT), [7, 8, 9]);
    }

    #[test]
    fn most_recent_occurrence_wins_among_equally_long_ones() {
        // The suffix "0 7 8" occurred once before, followed by 2.
        let tokens = [7, 8, 1, 0, 7, 8, 2, 0, 7];
        assert_eq!(index(&tokens).propose(8, 1, &FLAT), [2]);
        // Once it has occurred again (followed by 5), the newer occurrence wins.
        let mut grown = index(&tokens);
        grown.extend(&[8, 5, 0, 7]);
        assert_eq!(grown.propose(8, 1, &FLAT), [5]);
    }

    #[test]
    fn draft_length_grows_with_the_match_length() {
        let ramp = NgramConfig {
            min_ngram: 2,
            max_ngram: 6,
        };
        let block: Vec<u32> = (1..=12).collect();
        let mut tokens = block.clone();
        tokens.push(99);
        // Context ends with the first m tokens of the block: a match of m tokens.
        let drafts_after = |m: usize| {
            let mut history = tokens.clone();
            history.extend(&block[..m - 1]);
            index(&history).propose(block[m - 1], 8, &ramp).len()
        };
        let lengths: Vec<usize> = (1..=7).map(drafts_after).collect();
        assert_eq!(lengths, [0, 2, 3, 4, 5, 8, 8]);
    }

    #[test]
    fn no_match_gives_no_drafts() {
        assert!(index(&[1, 2, 3]).propose(4, 5, &FLAT).is_empty());
        assert!(index(&[]).propose(4, 5, &FLAT).is_empty());
        // The match must be at least min_ngram long.
        let pairs = NgramConfig {
            min_ngram: 2,
            max_ngram: 3,
        };
        assert!(index(&[5, 6, 7]).propose(5, 3, &pairs).is_empty());
        assert_eq!(index(&[5, 6, 7]).propose(5, 3, &FLAT), [6, 7, 5]);
    }

    #[test]
    fn count_cuts_the_drafts() {
        let index = index(&[1, 2, 3, 4, 5, 6, 1]);
        assert_eq!(index.propose(2, 3, &FLAT), [3, 4, 5]);
        assert_eq!(index.propose(2, 1, &FLAT), [3]);
        assert!(index.propose(2, 0, &FLAT).is_empty());
    }

    #[test]
    fn continuation_reads_past_the_end_as_a_period() {
        // Context 4 5 6 4 5 | 6: the match "4 5 6" ends at 3; its continuation runs into the
        // bonus and then over the drafts themselves.
        let period = index(&[4, 5, 6, 4, 5]);
        assert_eq!(
            period.longest_match(6),
            Some(SuffixMatch { len: 3, end: 3 })
        );
        assert_eq!(period.propose(6, 7, &FLAT), [4, 5, 6, 4, 5, 6]);
        // A run of one token continues itself.
        assert_eq!(index(&[2, 2]).propose(2, 4, &FLAT), [2, 2, 2]);
    }

    /// The definition, read off the whole context every time: the longest suffix of
    /// `history ++ [bonus]` ending earlier, its most recent end, and the drafts.
    fn brute_force(
        config: &NgramConfig,
        history: &[u32],
        bonus: u32,
        count: usize,
    ) -> (Option<SuffixMatch>, Vec<u32>) {
        let mut context = history.to_vec();
        context.push(bonus);
        let len = context.len();
        let found = (1..len).rev().find_map(|n| {
            let suffix = &context[len - n..];
            (n..len)
                .rev()
                .find(|&end| &context[end - n..end] == suffix)
                .map(|end| SuffixMatch { len: n, end })
        });
        let Some(found) = found else {
            return (None, Vec::new());
        };
        let wanted = config.draft_limit(found.len, count).min(len);
        let mut drafts = Vec::new();
        while drafts.len() < wanted {
            let position = found.end + drafts.len();
            drafts.push(match context.get(position) {
                Some(&token) => token,
                None => drafts[position - len],
            });
        }
        (Some(found), drafts)
    }

    #[test]
    fn incremental_index_equals_batch_build_and_brute_force() {
        let mut state = 0x5EED_u64;
        let mut next = |bound: u64| {
            state = mix64(state.wrapping_add(0x9E37_79B9_7F4A_7C15));
            state % bound
        };
        let mut long_matches = 0;
        for trial in 0..60 {
            let vocab = 2 + next(6);
            let min_ngram = 1 + next(3) as usize;
            let config = NgramConfig {
                min_ngram,
                max_ngram: min_ngram + next(6) as usize,
            };
            let mut incremental = SuffixIndex::new();
            let mut history = Vec::new();
            for _ in 0..40 {
                // Sometimes copy an earlier stretch and let the bonus go on copying, so long
                // matches occur.
                let mut follower = None;
                let chunk: Vec<u32> = if next(3) == 0 && history.len() > 8 {
                    let start = next(history.len() as u64 - 4) as usize;
                    let stop = (start + 2 + next(12) as usize).min(history.len());
                    follower = history.get(stop).copied();
                    history[start..stop].to_vec()
                } else {
                    (0..next(5)).map(|_| next(vocab) as u32).collect()
                };
                incremental.extend(&chunk);
                history.extend_from_slice(&chunk);
                assert_eq!(incremental.tokens(), history.as_slice());
                let batch = index(&history);
                let random = next(vocab) as u32;
                let bonus = follower.filter(|_| next(2) == 0).unwrap_or(random);
                let count = next(12) as usize;
                let (found, drafts) = brute_force(&config, &history, bonus, count);
                let case = format!("trial {trial} {config:?} {history:?} + {bonus}, {count}");
                assert_eq!(incremental.longest_match(bonus), found, "{case}");
                assert_eq!(batch.longest_match(bonus), found, "{case}");
                assert_eq!(incremental.propose(bonus, count, &config), drafts, "{case}");
                long_matches += usize::from(found.is_some_and(|f| f.len > 8));
            }
        }
        assert!(
            long_matches > 20,
            "only {long_matches} matches longer than 8"
        );
    }
}
