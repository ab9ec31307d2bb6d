//! Token trees: a block whose tokens branch. Node 0 is the root (a verify block's bonus
//! token); node `j + 1`'s parent is node `parents[j]`, an earlier node, so every node
//! follows its ancestors and its depth is the length of its path. The nodes sit in the
//! cache in order from slot `start`; a node is at position `start + depth` of its sequence
//! and sees the positions before `start` and its own ancestors only. A tree may be run in
//! several forwards (a drafter growing it level by level): each runs its newest nodes.

/// Why `parents` is not a tree over `nodes` tokens.
pub fn check(parents: &[u32], nodes: usize) -> Result<(), String> {
    if parents.len() + 1 != nodes {
        return Err(format!(
            "{} parents for {nodes} tokens (one per token after the first)",
            parents.len()
        ));
    }
    match parents.iter().enumerate().find(|&(j, &p)| p as usize > j) {
        Some((j, p)) => Err(format!(
            "parents[{j}] is {p}: a node's parent must come before it"
        )),
        None => Ok(()),
    }
}

/// Why a block of `tokens` new tokens after `cached` positions cannot be the last nodes of
/// the tree `parents` (the earlier nodes must be in the cache).
pub fn check_block(parents: &[u32], tokens: usize, cached: usize) -> Result<(), String> {
    let nodes = parents.len() + 1;
    if nodes < tokens || nodes > cached + tokens {
        return Err(format!(
            "a tree of {nodes} nodes cannot end with {tokens} new tokens after {cached} cached \
             positions"
        ));
    }
    check(parents, nodes)
}

/// Why `path` is not a root-first path of a tree block whose root is in slot `start` of a
/// cache holding `len` positions.
pub fn check_path(start: usize, path: &[usize], len: usize) -> Result<(), String> {
    let in_block = path
        .iter()
        .enumerate()
        .all(|(k, &node)| node >= k && start + node < len);
    if !in_block || path.first().is_some_and(|&root| root != 0) {
        return Err(format!(
            "path {path:?} is not a root-first path of the block at {start} (the cache holds \
             {len})"
        ));
    }
    Ok(())
}

/// The slot of the root of the tree `parents` whose last `tokens` nodes follow `past`
/// cached slots (which hold its earlier nodes).
pub fn root(parents: &[u32], tokens: usize, past: usize) -> usize {
    (past + tokens).saturating_sub(parents.len() + 1)
}

/// The depth of every node (the root's is 0).
pub fn depths(parents: &[u32]) -> Vec<usize> {
    let mut depths = Vec::with_capacity(parents.len() + 1);
    depths.push(0);
    for &p in parents {
        let depth = depths.get(p as usize).map_or(0, |d| d + 1);
        depths.push(depth);
    }
    depths
}

/// The position of each of a block's `tokens` new tokens after `past` cached slots: one
/// after another for a chain (`parents` empty), by depth for the last nodes of a tree.
pub fn positions(parents: &[u32], tokens: usize, past: usize) -> Vec<usize> {
    if parents.is_empty() {
        return (past..past + tokens).collect();
    }
    let earlier = (parents.len() + 1).saturating_sub(tokens);
    let root = root(parents, tokens, past);
    let depths = depths(parents);
    (0..tokens)
        .map(|i| root + depths.get(earlier + i).copied().unwrap_or(i))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depths_follow_parents() {
        assert_eq!(depths(&[]), vec![0]);
        assert_eq!(depths(&[0, 1, 0, 2]), vec![0, 1, 2, 1, 3]);
    }

    #[test]
    fn positions_go_by_depth_in_a_tree() {
        assert_eq!(positions(&[], 3, 5), vec![5, 6, 7]);
        // Nodes 0..=4 from slot 5; the last three run now, after 7 cached slots.
        assert_eq!(positions(&[0, 1, 0, 2], 5, 5), vec![5, 6, 7, 6, 8]);
        assert_eq!(positions(&[0, 1, 0, 2], 3, 7), vec![7, 6, 8]);
    }

    #[test]
    fn a_parent_after_its_child_is_refused() {
        assert!(check(&[0, 1], 3).is_ok());
        assert!(check(&[0, 2], 3).is_err());
        assert!(check(&[0], 3).is_err());
    }
}
