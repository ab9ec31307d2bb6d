//! Rejection branches of a pre-draft: besides assuming every draft is accepted, the drafter
//! pre-drafts the next round for the likeliest rejections, each with its own copy of the
//! session's cache.
//!
//! A branch assumes the target accepts the first `accepted` drafts and then emits the
//! drafter's runner-up at the next position instead of its draft: the drafter's best guess
//! of the correction. Branches are chosen by a two-way estimate from the logit margins of
//! the drafts (the chance that the draft wins against its runner-up is the logistic of the
//! margin): the chance that every draft before the branch point is accepted and the one at
//! it is rejected. Margins are cheap (the same pass over the head gives both tokens) and
//! order the rejection points well; they are not calibrated probabilities.

use specd_core::DraftTree;
use specd_models::TopTwo;

/// One pre-drafted token and the drafter's runner-up for it (none for a branch's assumed
/// correction, which the drafter did not draft).
pub type Ranked = TopTwo;

/// A pre-draft for one rejection point.
pub struct Branch<C> {
    /// Drafts of the round the branch assumes accepted.
    pub accepted: usize,
    /// The session's cache up to the rejection point, then what the branch fed.
    pub cache: C,
    /// Committed positions of `cache` when it was copied (they stay valid for any later
    /// state of the session).
    pub committed: usize,
    /// The assumed correction, then the drafts after it; all but the last are fed.
    pub predraft: Vec<Ranked>,
}

/// A cache kept for the next branch, with the committed positions it holds.
pub struct SpareCache<C> {
    pub cache: C,
    pub committed: usize,
}

/// Where to branch: the draft index (drafts accepted before it) and the correction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BranchPoint {
    pub accepted: usize,
    pub correction: u32,
}

/// The `width` likeliest rejection points of a round's drafts, likeliest first.
pub fn choose(drafts: &[Ranked], width: usize) -> Vec<BranchPoint> {
    let mut all_accepted_so_far = 1.0f64;
    let mut scored = Vec::with_capacity(drafts.len());
    for (i, draft) in drafts.iter().enumerate() {
        let Some((correction, runner_logit)) = draft.runner_up else {
            break;
        };
        let margin = f64::from(draft.best.1 - runner_logit);
        if !margin.is_finite() {
            break;
        }
        let kept = 1.0 / (1.0 + (-margin).exp());
        scored.push((
            all_accepted_so_far * (1.0 - kept),
            BranchPoint {
                accepted: i,
                correction,
            },
        ));
        all_accepted_so_far *= kept;
    }
    // Earlier points first among equals: they are the ones every later round passes.
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.accepted.cmp(&b.1.accepted)));
    scored.into_iter().take(width).map(|(_, p)| p).collect()
}

/// The token tree of a round's drafts (`chain`, with `drafts` ranked) and its
/// `branch_nodes` likeliest rejection points' corrections, each a leaf beside the draft it
/// would replace (a sibling of it, so the target's token there is verified either way).
pub fn tree(chain: Vec<u32>, drafts: &[Ranked], branch_nodes: usize) -> DraftTree {
    let points: Vec<BranchPoint> = choose(drafts, branch_nodes)
        .into_iter()
        .filter(|p| p.accepted < chain.len())
        .collect();
    if points.is_empty() {
        return DraftTree::chain(chain);
    }
    // Draft `i` (slot `i + 1`) follows slot `i`; a correction of draft `i` does too.
    let mut parents: Vec<u32> = (0..chain.len() as u32).collect();
    let mut tokens = chain;
    for point in points {
        tokens.push(point.correction);
        parents.push(point.accepted as u32);
    }
    DraftTree { tokens, parents }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrections_are_leaves_beside_the_drafts_they_replace() {
        let drafts = [
            ranked((5, 10.0), (6, 1.0)),
            ranked((7, 3.0), (8, 2.9)),
            ranked((9, 4.0), (1, 3.95)),
        ];
        let tree = tree(vec![5, 7, 9], &drafts, 2);
        assert_eq!(tree.tokens, vec![5, 7, 9, 8, 1]);
        assert_eq!(tree.parents, vec![0, 1, 2, 1, 2]);
        assert!(tree.check().is_ok());
        assert_eq!(tree.depth(), 3);
        assert!(super::tree(vec![5, 7, 9], &drafts, 0).is_chain());
    }

    fn ranked(best: (u32, f32), runner_up: (u32, f32)) -> Ranked {
        TopTwo {
            best,
            runner_up: Some(runner_up),
        }
    }

    #[test]
    fn the_least_sure_early_drafts_branch_first() {
        let drafts = [
            ranked((5, 10.0), (6, 1.0)),
            ranked((7, 3.0), (8, 2.9)),
            ranked((9, 4.0), (1, 3.95)),
            ranked((2, 8.0), (3, 0.0)),
        ];
        let points = choose(&drafts, 2);
        assert_eq!(
            points,
            vec![
                BranchPoint {
                    accepted: 1,
                    correction: 8
                },
                BranchPoint {
                    accepted: 2,
                    correction: 1
                },
            ]
        );
        assert!(choose(&drafts, 0).is_empty());
        assert_eq!(choose(&drafts, 9).len(), 4);
    }

    #[test]
    fn drafts_without_a_runner_up_end_the_candidates() {
        let drafts = [
            ranked((5, 1.0), (6, 0.5)),
            TopTwo {
                best: (7, 3.0),
                runner_up: None,
            },
            ranked((9, 4.0), (1, 3.95)),
        ];
        let points = choose(&drafts, 3);
        assert_eq!(points.len(), 1);
        assert_eq!(points[0].accepted, 0);
    }
}
