//! Checks a verifier's answer against what the round asked for.

use crate::tree::{path_of, DraftTree};

/// Checks that `accepted` and `new_tokens` are what an acceptance walk of `drafts` with
/// `budget` can produce: `accepted <= drafts`, `new_tokens` are the accepted drafts then one
/// target token, cut to the budget.
pub(crate) fn check_verify_answer(
    tree: &DraftTree,
    budget: usize,
    accepted: usize,
    new_tokens: &[u32],
) -> Result<(), String> {
    if !tree.is_chain() {
        return check_tree_answer(tree, budget, accepted, new_tokens);
    }
    check_chain_answer(&tree.tokens, budget, accepted, new_tokens)
}

/// A tree's answer: the accepted drafts are a path from the root, then one target token,
/// cut to the budget (which a tree's depth never exceeds).
fn check_tree_answer(
    tree: &DraftTree,
    budget: usize,
    accepted: usize,
    new_tokens: &[u32],
) -> Result<(), String> {
    let expected_len = (accepted + 1).min(budget);
    if accepted > tree.depth() || new_tokens.len() != expected_len || new_tokens.len() < accepted {
        return Err(format!(
            "{} new tokens with {accepted} accepted, for a tree of depth {} (budget {budget})",
            new_tokens.len(),
            tree.depth()
        ));
    }
    match path_of(&tree.tokens, &tree.parents, &new_tokens[..accepted]) {
        Some(_) => Ok(()),
        None => Err("the accepted drafts are not a path of the tree".to_owned()),
    }
}

fn check_chain_answer(
    drafts: &[u32],
    budget: usize,
    accepted: usize,
    new_tokens: &[u32],
) -> Result<(), String> {
    if accepted > drafts.len() {
        return Err(format!(
            "accepted {accepted} of only {} drafts",
            drafts.len()
        ));
    }
    let expected_len = (accepted + 1).min(budget);
    if new_tokens.len() != expected_len {
        return Err(format!(
            "{} new tokens, expected {expected_len} (accepted {accepted}, budget {budget})",
            new_tokens.len()
        ));
    }
    let echoed = accepted.min(new_tokens.len());
    if new_tokens[..echoed] != drafts[..echoed] {
        return Err("new tokens do not start with the accepted drafts".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_verify_answer(
        drafts: &[u32],
        budget: usize,
        accepted: usize,
        new_tokens: &[u32],
    ) -> Result<(), String> {
        check_chain_answer(drafts, budget, accepted, new_tokens)
    }

    #[test]
    fn tree_answers_follow_a_path() {
        let tree = DraftTree {
            tokens: vec![10, 11, 20],
            parents: vec![0, 1, 0],
        };
        assert!(super::check_verify_answer(&tree, 10, 1, &[20, 5]).is_ok());
        assert!(super::check_verify_answer(&tree, 10, 2, &[10, 11, 5]).is_ok());
        assert!(super::check_verify_answer(&tree, 10, 2, &[20, 11, 5]).is_err());
        assert!(super::check_verify_answer(&tree, 10, 3, &[10, 11, 5, 6]).is_err());
    }

    #[test]
    fn accepts_consistent_answers() {
        assert!(check_verify_answer(&[1, 2, 3], 10, 1, &[1, 9]).is_ok());
        assert!(check_verify_answer(&[1, 2], 10, 2, &[1, 2, 7]).is_ok());
        assert!(check_verify_answer(&[1, 2], 2, 2, &[1, 2]).is_ok());
        assert!(check_verify_answer(&[], 1, 0, &[5]).is_ok());
    }

    #[test]
    fn rejects_inconsistent_answers() {
        assert!(check_verify_answer(&[1], 10, 2, &[1, 2, 3]).is_err());
        assert!(check_verify_answer(&[1, 2], 10, 1, &[1, 2, 3]).is_err());
        assert!(check_verify_answer(&[1, 2], 10, 1, &[1]).is_err());
        assert!(check_verify_answer(&[1, 2], 10, 1, &[3, 4]).is_err());
        assert!(check_verify_answer(&[1, 2], 1, 1, &[1, 2]).is_err());
    }
}
