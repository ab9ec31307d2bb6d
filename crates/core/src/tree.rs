//! Token trees: drafts that branch, verified in one forward. Verify slot 0 holds the bonus
//! token (the root); draft `j` sits at slot `j + 1` and its parent is slot `parents[j]`, an
//! earlier slot. A chain is the tree whose every draft follows the one before it; an empty
//! `parents` says so.

use crate::acceptance::Accepted;

/// Drafts for one round and the tree they form.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DraftTree {
    /// The drafts, each after its parent.
    pub tokens: Vec<u32>,
    /// Draft `j`'s parent slot (`0`: the bonus); empty for a chain.
    pub parents: Vec<u32>,
}

impl DraftTree {
    /// Drafts that follow one another.
    pub fn chain(tokens: Vec<u32>) -> Self {
        Self {
            tokens,
            parents: Vec::new(),
        }
    }

    pub fn is_chain(&self) -> bool {
        self.parents.is_empty()
    }

    /// The parent slot of draft `j` (`j` itself for a chain: the slot before `j + 1`).
    pub fn parent(&self, j: usize) -> usize {
        parent_of(&self.parents, j)
    }

    /// The deepest path's drafts (the drafts of a chain).
    pub fn depth(&self) -> usize {
        if self.is_chain() {
            return self.tokens.len();
        }
        self.depths().into_iter().max().unwrap_or(0)
    }

    /// Each draft's depth (1 for the bonus's children).
    pub fn depths(&self) -> Vec<usize> {
        let mut depths = vec![0usize; self.tokens.len() + 1];
        for j in 0..self.tokens.len() {
            depths[j + 1] = depths[self.parent(j)] + 1;
        }
        depths.remove(0);
        depths
    }

    /// Whether the tree stays within `levels` levels and `levels + branch_drafts` drafts (what
    /// a round asked for).
    pub fn fits(&self, levels: usize, branch_drafts: usize) -> bool {
        self.tokens.len() <= levels + branch_drafts && self.depth() <= levels
    }

    /// Why this is not a tree of distinct siblings, if it is not.
    pub fn check(&self) -> Result<(), String> {
        check_parents(&self.tokens, &self.parents)
    }
}

fn parent_of(parents: &[u32], j: usize) -> usize {
    parents.get(j).map_or(j, |&p| p as usize)
}

/// Why `parents` does not make a tree of `drafts` whose siblings are distinct tokens.
pub fn check_parents(drafts: &[u32], parents: &[u32]) -> Result<(), String> {
    if parents.is_empty() {
        return Ok(());
    }
    if parents.len() != drafts.len() {
        return Err(format!(
            "{} parents for {} drafts (one per draft, or none for a chain)",
            parents.len(),
            drafts.len()
        ));
    }
    for (j, &p) in parents.iter().enumerate() {
        if p as usize > j {
            return Err(format!(
                "parents[{j}] is {p}: a draft's parent must be an earlier slot (at most {j})"
            ));
        }
        if let Some(i) = (0..j).find(|&i| parents[i] == p && drafts[i] == drafts[j]) {
            return Err(format!(
                "drafts {i} and {j} are the same token under the same parent"
            ));
        }
    }
    Ok(())
}

/// The first child of slot `node` whose token is `token`.
fn child_with(drafts: &[u32], parents: &[u32], node: usize, token: u32) -> Option<usize> {
    (node..drafts.len())
        .find(|&j| parent_of(parents, j) == node && drafts[j] == token)
        .map(|j| j + 1)
}

/// The acceptance walk over a tree: from the root, the target's token at the current slot
/// is emitted, and the walk moves to the child holding it until no child does. Returns the
/// walk's [`Accepted`] (accepted = the path's drafts) and the path's slots, root first.
///
/// `target_at(slot, depth)` yields the target's choice after `slot`, the `depth`-th token
/// of the round (its output index is the round's base plus `depth`). It is called once per
/// slot of the path and for no other. Over a chain this is [`crate::accept_drafts`].
pub fn accept_tree<E>(
    drafts: &[u32],
    parents: &[u32],
    budget: usize,
    mut target_at: impl FnMut(usize, usize) -> Result<u32, E>,
) -> Result<(Accepted, Vec<usize>), E> {
    let mut path = vec![0];
    let mut new_tokens = Vec::with_capacity(budget.min(drafts.len() + 1));
    loop {
        let node = path[path.len() - 1];
        let target = target_at(node, path.len() - 1)?;
        if new_tokens.len() < budget {
            new_tokens.push(target);
        }
        match child_with(drafts, parents, node, target) {
            Some(child) => path.push(child),
            None => {
                let accepted = Accepted {
                    accepted: path.len() - 1,
                    new_tokens,
                };
                return Ok((accepted, path));
            }
        }
    }
}

/// The slots of the path whose drafts are `accepted` (root first), if the tree has it.
pub fn path_of(drafts: &[u32], parents: &[u32], accepted: &[u32]) -> Option<Vec<usize>> {
    let path = walk(drafts, parents, accepted);
    (path.len() == accepted.len() + 1).then_some(path)
}

/// The slots of the longest path from the root whose drafts begin `tokens` (root first):
/// where the target's tokens `tokens` lead through the tree.
pub fn walk(drafts: &[u32], parents: &[u32], tokens: &[u32]) -> Vec<usize> {
    let mut path = vec![0];
    for &token in tokens {
        let node = path[path.len() - 1];
        match child_with(drafts, parents, node, token) {
            Some(child) => path.push(child),
            None => break,
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    /// Bonus 0 at slot 0; drafts: slot 1 = 10 (parent 0), slot 2 = 11 (parent 1),
    /// slot 3 = 20 (parent 0, a sibling of slot 1), slot 4 = 21 (parent 3), slot 5 = 12
    /// (parent 2).
    const DRAFTS: [u32; 5] = [10, 11, 20, 21, 12];
    const PARENTS: [u32; 5] = [0, 1, 0, 3, 2];

    fn walk(targets: &[(usize, u32)], budget: usize) -> (Accepted, Vec<usize>, Vec<usize>) {
        let mut asked = Vec::new();
        let (accepted, path) =
            accept_tree::<Infallible>(&DRAFTS, &PARENTS, budget, |slot, depth| {
                asked.push(slot);
                assert_eq!(depth, asked.len() - 1);
                Ok(targets
                    .iter()
                    .find(|(s, _)| *s == slot)
                    .map_or(999, |t| t.1))
            })
            .unwrap();
        (accepted, path, asked)
    }

    #[test]
    fn the_walk_follows_the_branch_the_target_takes() {
        let (accepted, path, asked) = walk(&[(0, 20), (3, 21), (4, 7)], 10);
        assert_eq!(accepted.accepted, 2);
        assert_eq!(accepted.new_tokens, vec![20, 21, 7]);
        assert_eq!(path, vec![0, 3, 4]);
        assert_eq!(asked, vec![0, 3, 4]);
        assert_eq!(path_of(&DRAFTS, &PARENTS, &[20, 21]), Some(vec![0, 3, 4]));
    }

    #[test]
    fn the_main_branch_all_accepted_and_a_root_rejection() {
        let (accepted, path, _) = walk(&[(0, 10), (1, 11), (2, 12), (5, 13)], 10);
        assert_eq!((accepted.accepted, path), (3, vec![0, 1, 2, 5]));
        assert_eq!(accepted.new_tokens, vec![10, 11, 12, 13]);
        let (accepted, path, _) = walk(&[(0, 5)], 10);
        assert_eq!(
            (accepted.accepted, path, accepted.new_tokens),
            (0, vec![0], vec![5])
        );
        let (accepted, _, _) = walk(&[(0, 10), (1, 11), (2, 12), (5, 13)], 2);
        assert_eq!(accepted.new_tokens, vec![10, 11]);
    }

    #[test]
    fn a_chain_walks_as_accept_drafts() {
        let drafts = [3, 4, 5];
        for targets in [[3, 4, 9, 0], [3, 4, 5, 6], [1, 2, 3, 4]] {
            let chain = crate::accept_drafts::<Infallible>(&drafts, 10, |s| Ok(targets[s]));
            let tree = accept_tree::<Infallible>(&drafts, &[], 10, |s, _| Ok(targets[s]));
            assert_eq!(chain.unwrap(), tree.unwrap().0);
        }
    }

    #[test]
    fn bad_trees_are_refused() {
        assert!(check_parents(&DRAFTS, &PARENTS).is_ok());
        assert!(check_parents(&[1, 2], &[0, 2]).is_err());
        assert!(check_parents(&[1, 1], &[0, 0]).is_err());
        assert!(check_parents(&[1, 2], &[0]).is_err());
        let tree = DraftTree {
            tokens: DRAFTS.to_vec(),
            parents: PARENTS.to_vec(),
        };
        assert_eq!(tree.depth(), 3);
        assert_eq!(DraftTree::chain(vec![1, 2]).depth(), 2);
    }
}
