//! Prompt lookup as a token tree: where the matched n-gram occurred more than once, what
//! followed its other occurrences branches off the longest match's continuation.

use super::config::NgramConfig;
use super::continuation::continuation;
use super::index::{SuffixIndex, SuffixMatch};
use crate::tree::DraftTree;

/// Shorter n-grams occur too often for what followed them to be worth a verify row.
const MIN_BRANCH_NGRAM: usize = 2;
/// How far back other occurrences are looked for (tokens of context).
const SCAN_WINDOW: usize = 8192;
/// Other occurrences read at most, most recent first.
const MAX_OCCURRENCES: usize = 8;

impl SuffixIndex {
    /// [`Self::lookup`] as a tree: the longest match's continuation is the chain (each draft
    /// the first child of the one before), and beside it up to `branch_nodes` drafts of what
    /// followed the other occurrences of the context's last `min(match, max_ngram)` tokens,
    /// most recent first, from where each parts from what the tree holds; no path is deeper
    /// than the chain's limit. A chain when nothing else followed.
    pub fn lookup_tree(
        &self,
        bonus: u32,
        count: usize,
        branch_nodes: usize,
        config: &NgramConfig,
    ) -> Option<(SuffixMatch, DraftTree)> {
        let (found, chain) = self.lookup(bonus, count, config)?;
        let ngram = found.len.min(config.max_ngram);
        if branch_nodes == 0 || ngram < MIN_BRANCH_NGRAM {
            return Some((found, DraftTree::chain(chain)));
        }
        let depth = chain.len();
        let mut tree = Growing::from_chain(chain);
        for end in self.other_occurrences(bonus, ngram, found.end) {
            let path = continuation(self.tokens(), bonus, end, depth);
            if !tree.add_path(&path, branch_nodes) {
                break;
            }
        }
        Some((found, tree.finish()))
    }

    /// Positions just after the earlier occurrences of the last `ngram` tokens of
    /// `tokens ++ [bonus]`, most recent first, `skip` left out.
    fn other_occurrences(&self, bonus: u32, ngram: usize, skip: usize) -> Vec<usize> {
        let tokens = self.tokens();
        let suffix_at = |i: usize| -> u32 {
            // Token `i` of the n-gram, the bonus last.
            if i + 1 == ngram {
                bonus
            } else {
                tokens[tokens.len() + 1 - ngram + i]
            }
        };
        if tokens.len() + 1 < ngram {
            return Vec::new();
        }
        let lowest = (tokens.len() + 1).saturating_sub(SCAN_WINDOW).max(ngram);
        let mut ends = Vec::new();
        // `end` follows an occurrence at tokens[end - ngram..end]; the context's own suffix
        // (end = tokens.len() + 1) is not one.
        for end in (lowest..=tokens.len()).rev() {
            if end == skip {
                continue;
            }
            if (0..ngram).all(|i| tokens[end - ngram + i] == suffix_at(i)) {
                ends.push(end);
                if ends.len() == MAX_OCCURRENCES {
                    break;
                }
            }
        }
        ends
    }
}

/// A tree under construction: the drafts and their parent slots.
struct Growing {
    tokens: Vec<u32>,
    parents: Vec<u32>,
    chain_len: usize,
}

impl Growing {
    fn from_chain(chain: Vec<u32>) -> Self {
        let parents = (0..chain.len() as u32).collect();
        Self {
            chain_len: chain.len(),
            tokens: chain,
            parents,
        }
    }

    /// Merges `path` (drafts from the root) into the tree, adding drafts where it parts from
    /// what is there while the budget of `branch_nodes` lasts; false once it is spent.
    fn add_path(&mut self, path: &[u32], branch_nodes: usize) -> bool {
        let mut at = 0u32;
        for &token in path {
            let child =
                (0..self.tokens.len()).find(|&j| self.parents[j] == at && self.tokens[j] == token);
            at = match child {
                Some(j) => j as u32 + 1,
                None => {
                    if self.tokens.len() - self.chain_len == branch_nodes {
                        return false;
                    }
                    self.tokens.push(token);
                    self.parents.push(at);
                    self.tokens.len() as u32
                }
            };
        }
        true
    }

    fn finish(self) -> DraftTree {
        if self.tokens.len() == self.chain_len {
            DraftTree::chain(self.tokens)
        } else {
            DraftTree {
                tokens: self.tokens,
                parents: self.parents,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(tokens: &[u32]) -> SuffixIndex {
        let mut index = SuffixIndex::new();
        index.extend(tokens);
        index
    }

    const CONFIG: NgramConfig = NgramConfig {
        min_ngram: 1,
        max_ngram: 2,
    };

    #[test]
    fn other_continuations_branch_off_the_chain() {
        // "7 8" was followed by 1 2 3, then 1 5 6, then (most recently) 4 4 4.
        let context = [7, 8, 1, 2, 3, 0, 7, 8, 1, 5, 6, 0, 7, 8, 4, 4, 4, 0, 7];
        let (found, tree) = index(&context).lookup_tree(8, 3, 8, &CONFIG).unwrap();
        assert_eq!(found.end, 14, "the most recent occurrence drafts the chain");
        tree.check().unwrap();
        // The chain 4 4 4, then 1 5 6 (the next most recent), then 2 3 under its 1.
        assert_eq!(tree.tokens, [4, 4, 4, 1, 5, 6, 2, 3]);
        assert_eq!(tree.parents, [0, 1, 2, 0, 4, 5, 4, 7]);
        assert_eq!(tree.depth(), 3);
    }

    #[test]
    fn the_budget_caps_the_branches() {
        let context = [7, 8, 1, 2, 3, 0, 7, 8, 1, 5, 6, 0, 7, 8, 4, 4, 4, 0, 7];
        let (_, tree) = index(&context).lookup_tree(8, 3, 2, &CONFIG).unwrap();
        assert_eq!(tree.tokens, [4, 4, 4, 1, 5]);
        assert_eq!(tree.parents, [0, 1, 2, 0, 4]);
        let (_, chain) = index(&context).lookup_tree(8, 3, 0, &CONFIG).unwrap();
        assert_eq!(chain, DraftTree::chain(vec![4, 4, 4]));
    }

    #[test]
    fn one_occurrence_or_a_one_token_match_is_a_chain() {
        let (_, tree) = index(&[7, 8, 1, 2, 3, 0, 7])
            .lookup_tree(8, 3, 4, &CONFIG)
            .unwrap();
        assert_eq!(tree, DraftTree::chain(vec![1, 2, 3]));
        // Only the bonus matched: too short an n-gram to branch on.
        let (found, tree) = index(&[5, 1, 9, 2, 9])
            .lookup_tree(5, 2, 4, &CONFIG)
            .unwrap();
        assert_eq!(found.len, 1);
        assert!(tree.is_chain());
        // Continuations that agree with the chain add nothing.
        let (_, tree) = index(&[7, 8, 1, 2, 7, 8, 1, 2, 7])
            .lookup_tree(8, 2, 4, &CONFIG)
            .unwrap();
        assert_eq!(tree, DraftTree::chain(vec![1, 2]));
    }
}
