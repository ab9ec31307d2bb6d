//! A suffix automaton over token ids, built one token at a time.
//!
//! Each state stands for a set of substrings of the indexed tokens that end at the same
//! positions; its suffix link leads to the state of its longest suffix outside that set. The
//! automaton has at most `2n` states and `3n` transitions for `n` tokens, appending a token
//! costs amortised O(1) state changes (Blumer et al.; the structure behind SAM decoding), and
//! the longest suffix of the tokens plus one more token that occurs among the tokens is found
//! by walking suffix links from the state of the whole sequence.

use super::edges::Edges;

/// How many states up the suffix-link chain of a new token's state learn that their strings
/// now also end there.
///
/// Every state on that chain gains the new end position, but the chain can be as long as the
/// longest repeated suffix (thousands of tokens inside a long copy), so updating all of it
/// would make appending cost O(n) in the worst case. The states past this depth keep an older
/// end: still a real occurrence, only not the most recent one. They are the shorter, more
/// frequent strings of a long repetition, which draft few tokens anyway.
pub(crate) const RECENCY_DEPTH: usize = 64;

/// The root: the empty string.
const ROOT: u32 = 0;
/// The root's suffix link.
const NO_LINK: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct State {
    /// Length of the longest string of the state.
    len: u32,
    /// The state of the longest suffix that ends at more positions; [`NO_LINK`] for the root.
    link: u32,
    /// Position just after an occurrence of the state's strings: the most recent one, but
    /// see [`RECENCY_DEPTH`].
    end: u32,
    edges: Edges,
}

/// Where a suffix of the indexed tokens plus one more token occurred among the indexed ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    /// Length of the match, the extra token included.
    pub len: usize,
    /// Position just after the occurrence (at most the number of indexed tokens): where its
    /// continuation starts.
    pub end: usize,
}

/// The automaton of every token appended so far.
#[derive(Clone, Debug)]
pub(crate) struct SuffixAutomaton {
    states: Vec<State>,
    /// The state of the whole sequence.
    last: u32,
}

impl Default for SuffixAutomaton {
    fn default() -> Self {
        Self {
            states: vec![State {
                len: 0,
                link: NO_LINK,
                end: 0,
                edges: Edges::default(),
            }],
            last: ROOT,
        }
    }
}

impl SuffixAutomaton {
    /// Tokens indexed so far.
    pub(crate) fn len(&self) -> usize {
        self.state(self.last).len as usize
    }

    /// Whether another token fits: state ids and positions are `u32`, and a token adds at
    /// most two states.
    pub(crate) fn has_room(&self) -> bool {
        self.states.len() < (NO_LINK as usize) - 2
    }

    fn state(&self, id: u32) -> &State {
        &self.states[id as usize]
    }

    fn state_mut(&mut self, id: u32) -> &mut State {
        &mut self.states[id as usize]
    }

    /// Adds a state, returning its id (callers check [`Self::has_room`] first).
    fn push(&mut self, state: State) -> u32 {
        let id = self.states.len() as u32;
        self.states.push(state);
        id
    }

    /// Appends `token`. Returns false, indexing nothing, once [`Self::has_room`] is false.
    pub(crate) fn push_token(&mut self, token: u32) -> bool {
        if !self.has_room() {
            return false;
        }
        let position = self.state(self.last).len + 1;
        let current = self.push(State {
            len: position,
            link: ROOT,
            end: position,
            edges: Edges::default(),
        });
        // Every suffix of the old sequence without a `token` edge now gets one, to the new
        // state; the first that has one decides the new state's suffix link.
        let mut p = self.last;
        while p != NO_LINK && self.state(p).edges.get(token).is_none() {
            self.state_mut(p).edges.set(token, current);
            p = self.state(p).link;
        }
        if p != NO_LINK {
            self.attach(p, token, current);
        }
        self.last = current;
        self.refresh_ends(current, position);
        true
    }

    /// Links `current` below the state that `p`'s `token` edge reaches, splitting that state
    /// when it also holds strings longer than `p`'s longest plus `token`.
    fn attach(&mut self, p: u32, token: u32, current: u32) {
        let Some(q) = self.state(p).edges.get(token) else {
            return;
        };
        let wanted = self.state(p).len + 1;
        if self.state(q).len == wanted {
            self.state_mut(current).link = q;
            return;
        }
        let split = State {
            len: wanted,
            ..self.state(q).clone()
        };
        let clone = self.push(split);
        let mut p = p;
        while p != NO_LINK && self.state(p).edges.get(token) == Some(q) {
            self.state_mut(p).edges.set(token, clone);
            p = self.state(p).link;
        }
        self.state_mut(q).link = clone;
        self.state_mut(current).link = clone;
    }

    /// Records `position` as the latest end of the states up `current`'s suffix-link chain,
    /// as far as [`RECENCY_DEPTH`].
    fn refresh_ends(&mut self, current: u32, position: u32) {
        let mut state = self.state(current).link;
        for _ in 0..RECENCY_DEPTH {
            if state == ROOT || state == NO_LINK {
                return;
            }
            let entry = self.state_mut(state);
            entry.end = position;
            state = entry.link;
        }
    }

    /// The longest suffix of the indexed tokens followed by `token` that occurs among the
    /// indexed tokens, and where; `None` when `token` never occurred.
    ///
    /// The walk visits the same states as appending `token` would, so drafting before each
    /// append keeps the amortised cost.
    pub(crate) fn longest_match(&self, token: u32) -> Option<Found> {
        let mut p = self.last;
        while p != NO_LINK {
            let state = self.state(p);
            if let Some(q) = state.edges.get(token) {
                return Some(Found {
                    len: state.len as usize + 1,
                    end: self.state(q).end as usize,
                });
            }
            p = state.link;
        }
        None
    }

    /// States in use (for tests of the size bound).
    #[cfg(test)]
    pub(crate) fn state_count(&self) -> usize {
        self.states.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn automaton(tokens: &[u32]) -> SuffixAutomaton {
        let mut automaton = SuffixAutomaton::default();
        for &token in tokens {
            assert!(automaton.push_token(token));
        }
        automaton
    }

    #[test]
    fn finds_the_longest_suffix_and_its_latest_end() {
        // Tokens 1 2 3 4 1 2 3 5 1 2; the suffix "1 2" plus 3 occurred twice, last ending at 7.
        let a = automaton(&[1, 2, 3, 4, 1, 2, 3, 5, 1, 2]);
        assert_eq!(a.len(), 10);
        assert_eq!(a.longest_match(3), Some(Found { len: 3, end: 7 }));
        // "2" plus 5 never occurred, but 5 alone did, ending at 8.
        assert_eq!(a.longest_match(5), Some(Found { len: 1, end: 8 }));
        assert_eq!(a.longest_match(9), None);
        assert_eq!(SuffixAutomaton::default().longest_match(1), None);
    }

    #[test]
    fn state_count_stays_linear() {
        for tokens in [
            (0..500).map(|i| i % 7).collect::<Vec<u32>>(),
            vec![4; 500],
            (0..500).map(|i| (i * i) % 13).collect(),
        ] {
            assert!(automaton(&tokens).state_count() <= 2 * tokens.len());
        }
    }

    #[test]
    fn deep_chains_keep_a_real_if_older_end() {
        // 200 equal tokens then 9: every run "4..4" is its own state, and the chain of the
        // last one is 200 deep, beyond the refresh depth. The single token 4 followed the
        // context most recently at 200, but its state was last refreshed at 1 + RECENCY_DEPTH.
        let mut tokens = vec![4; 200];
        tokens.push(9);
        let a = automaton(&tokens);
        let found = a.longest_match(4).unwrap();
        assert_eq!(found.len, 1);
        assert_eq!(found.end, 1 + RECENCY_DEPTH);
        assert_eq!(tokens[found.end - 1], 4, "the end is a real occurrence");
    }
}
