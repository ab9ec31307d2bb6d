//! The outgoing transitions of one suffix-automaton state, keyed by token.

use std::collections::HashMap;

/// Transitions a state keeps in a plain list before switching to a hash map. Most states have
/// one or two (a context is followed by few distinct tokens), so a short list costs one small
/// allocation and a scan shorter than a hash; a state followed by many tokens (a frequent
/// token's own state) still answers in O(1).
const LIST_LIMIT: usize = 8;

/// `token -> state` for one state.
#[derive(Clone, Debug)]
pub(crate) enum Edges {
    /// Unordered `(token, state)` pairs, at most [`LIST_LIMIT`].
    List(Vec<(u32, u32)>),
    Map(HashMap<u32, u32>),
}

impl Default for Edges {
    fn default() -> Self {
        Edges::List(Vec::new())
    }
}

impl Edges {
    /// The state `token` leads to.
    pub(crate) fn get(&self, token: u32) -> Option<u32> {
        match self {
            Edges::List(list) => list.iter().find(|(t, _)| *t == token).map(|&(_, s)| s),
            Edges::Map(map) => map.get(&token).copied(),
        }
    }

    /// Makes `token` lead to `state`, replacing any earlier target.
    pub(crate) fn set(&mut self, token: u32, state: u32) {
        match self {
            Edges::List(list) => {
                if let Some(edge) = list.iter_mut().find(|(t, _)| *t == token) {
                    edge.1 = state;
                } else if list.len() < LIST_LIMIT {
                    list.push((token, state));
                } else {
                    let mut map: HashMap<u32, u32> = list.drain(..).collect();
                    map.insert(token, state);
                    *self = Edges::Map(map);
                }
            }
            Edges::Map(map) => {
                map.insert(token, state);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_then_get_across_the_switch_to_a_map() {
        let mut edges = Edges::default();
        assert_eq!(edges.get(3), None);
        for token in 0..20 {
            edges.set(token, token + 100);
            assert!(matches!(
                (&edges, token < LIST_LIMIT as u32),
                (Edges::List(_), true) | (Edges::Map(_), false)
            ));
        }
        for token in 0..20 {
            assert_eq!(edges.get(token), Some(token + 100));
        }
        assert_eq!(edges.get(20), None);
        // Redirecting an edge (as cloning a state does) replaces its target in both forms.
        edges.set(5, 7);
        assert_eq!(edges.get(5), Some(7));
        let mut short = Edges::default();
        short.set(1, 2);
        short.set(1, 9);
        assert_eq!(short.get(1), Some(9));
        assert!(matches!(&short, Edges::List(list) if list.len() == 1));
    }
}
