//! Token trees from a draft model, grown level by level as EAGLE-2 grows them: each level
//! runs the likeliest candidates so far (a tree block over the session's cache, one packed
//! forward), and each run node proposes its greedy token and its runner-up. A candidate's
//! score is its parent's times its share of the pair: the logistic of the logit margin for
//! the greedy token, the rest for the runner-up (a two-way estimate, like the rejection
//! branches'; it orders candidates well without the full softmax). The round's tree is the
//! best-scored candidates, which always include their ancestors (a child never scores
//! above its parent).
//!
//! The session's cache then holds the bonus and every node run, in the order they ran;
//! once the target commits a path, the nodes of it that ran are kept in place
//! ([`specd_models::CausalLm::keep_path`]) and the rest dropped.

use specd_core::DraftTree;
use specd_models::{CausalLm, OutputRows, SeqBlock, TopTwo};

use super::{internal, DraftModelEngine, DraftModelSession};
use crate::engine::{DraftStep, EngineError};

/// Candidates run per level at most: a level costs one forward of this many rows, which
/// on a memory-bound CPU costs little more than one.
const LEVEL_WIDTH: usize = 4;

/// The nodes a tree draft ran through the session's cache, from the bonus (node 0), in
/// cache order from the committed length.
#[derive(Debug, Clone, Default)]
pub struct RunTree {
    pub tokens: Vec<u32>,
    /// Node `j + 1`'s parent node.
    pub parents: Vec<u32>,
}

impl RunTree {
    /// The nodes of `committed` (the bonus, then the accepted path) that ran, root first.
    pub fn path_of(&self, committed: &[u32]) -> Vec<usize> {
        let mut path = Vec::with_capacity(committed.len());
        if committed.first() != self.tokens.first() {
            return path;
        }
        path.push(0);
        for &token in &committed[1..] {
            let at = path[path.len() - 1];
            let child = self
                .parents
                .iter()
                .enumerate()
                .find(|&(j, &p)| p as usize == at && self.tokens[j + 1] == token);
            match child {
                Some((j, _)) => path.push(j + 1),
                None => break,
            }
        }
        path
    }
}

/// A proposed token: where it hangs and how likely the drafter thinks its path is.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    token: u32,
    /// Its parent: a candidate index, or `None` for the bonus.
    parent: Option<usize>,
    depth: usize,
    score: f64,
    /// Its node in the run tree once it ran.
    ran: Option<usize>,
    /// Its parent's greedy proposal (not the runner-up).
    greedy: bool,
}

/// The greedy token's and the runner-up's shares of a node's next token.
fn shares(ranked: &TopTwo) -> (f64, Option<(u32, f64)>) {
    match ranked.runner_up {
        Some((token, logit)) => {
            let margin = f64::from(ranked.best.1 - logit);
            let best = if margin.is_finite() {
                1.0 / (1.0 + (-margin).exp())
            } else {
                1.0
            };
            (best, Some((token, 1.0 - best)))
        }
        None => (1.0, None),
    }
}

impl<M: CausalLm> DraftModelEngine<M> {
    /// A tree of at most `step.count` levels and `step.count + branch_nodes` drafts.
    pub(super) fn grow_tree(
        &self,
        session: &mut DraftModelSession<M::Cache>,
        step: DraftStep,
        branch_nodes: usize,
    ) -> Result<DraftTree, EngineError> {
        let vocab = self.model.vocab_size();
        if step.bonus as usize >= vocab {
            return Err(EngineError::invalid(
                "draft.bonus",
                format!("token id {} is not below {vocab}", step.bonus),
            ));
        }
        session.forget_speculation();
        let budget = step.count + branch_nodes;
        // Level 0: the committed tokens not yet fed, then the bonus (the tree's root).
        let mut feed = std::mem::take(&mut session.pending);
        feed.push(step.bonus);
        let first = self.ranked(&mut [SeqBlock::chain(&mut session.cache, &feed)])?;
        let mut run = RunTree {
            tokens: vec![step.bonus],
            parents: Vec::new(),
        };
        let mut candidates: Vec<Candidate> = Vec::new();
        propose(&mut candidates, None, 0, 1.0, &first[0]);
        for _level in 1..step.count {
            // The greedy path's next node, and the best other candidates not yet run whose
            // children could still be drafts and make the tree.
            let open =
                |c: &usize| candidates[*c].ran.is_none() && candidates[*c].depth < step.count;
            let (mut frontier, mut others): (Vec<usize>, Vec<usize>) = (0..candidates.len())
                .filter(open)
                .partition(|&c| is_greedy_path(&candidates, c));
            let cut = nth_best_score(&candidates, budget).max(MIN_BRANCH_SCORE);
            others.retain(|&c| candidates[c].score >= cut);
            others.sort_by(|&a, &b| candidates[b].score.total_cmp(&candidates[a].score));
            frontier.extend(others.into_iter().take(LEVEL_WIDTH - 1));
            if frontier.is_empty() {
                break;
            }
            // Parents run before children: frontier order by creation keeps them so.
            frontier.sort_unstable();
            let mut tokens = Vec::with_capacity(frontier.len());
            for &c in &frontier {
                let parent_node = candidates[c].parent.map_or(0, |p| {
                    candidates[p]
                        .ran
                        .expect("a candidate's parent ran before it")
                });
                run.parents.push(parent_node as u32);
                run.tokens.push(candidates[c].token);
                tokens.push(candidates[c].token);
                candidates[c].ran = Some(run.tokens.len() - 1);
            }
            let ranked = self.ranked(&mut [SeqBlock {
                cache: &mut session.cache,
                tokens: &tokens,
                parents: &run.parents,
            }])?;
            for (&c, ranked) in frontier.iter().zip(&ranked) {
                let (depth, score) = (candidates[c].depth, candidates[c].score);
                propose(&mut candidates, Some(c), depth, score, ranked);
            }
        }
        session.run_tree = Some(run);
        Ok(select(&candidates, budget))
    }

    /// Each of the block's rows' greedy token and runner-up (one forward, every row).
    fn ranked(&self, rows: &mut [SeqBlock<'_, M::Cache>]) -> Result<Vec<TopTwo>, EngineError> {
        let hidden = self
            .model
            .forward(rows, OutputRows::All)
            .map_err(internal)?;
        let last = rows.len() == 1 && rows[0].parents.is_empty();
        let hidden = match (last, hidden.as_slice()) {
            // A chain block (level 0) proposes after its last token only.
            (true, [h]) => h.narrow(0, h.dim(0)? - 1, 1)?,
            (_, [h]) => h.clone(),
            _ => {
                return Err(EngineError::Internal(
                    "the draft model returned no rows".into(),
                ))
            }
        };
        let ranked = self
            .model
            .top_two_below(&hidden, self.draft_vocab)
            .map_err(internal)?;
        if ranked.len() != hidden.dim(0)? {
            return Err(EngineError::Internal(
                "the draft model ranked too few rows".into(),
            ));
        }
        Ok(ranked)
    }
}

/// The two proposals of a node at `depth` (0: the bonus) as candidates.
fn propose(
    candidates: &mut Vec<Candidate>,
    parent: Option<usize>,
    depth: usize,
    score: f64,
    ranked: &TopTwo,
) {
    let (best, runner_up) = shares(ranked);
    candidates.push(Candidate {
        token: ranked.best.0,
        parent,
        depth: depth + 1,
        score: score * best,
        ran: None,
        greedy: true,
    });
    if let Some((token, share)) = runner_up {
        candidates.push(Candidate {
            token,
            parent,
            depth: depth + 1,
            score: score * share,
            ran: None,
            greedy: false,
        });
    }
}

/// Least score of a branch worth a verify row (and a drafter row to grow it): below it the
/// row costs more than the token it may bring. On the real pair, 0.1 to 0.3 all gave about
/// the same tokens per round on prose; 0.1 keeps the most.
const MIN_BRANCH_SCORE: f64 = 0.1;

/// Whether `c` and its ancestors are each their parent's greedy proposal.
fn is_greedy_path(candidates: &[Candidate], c: usize) -> bool {
    let mut at = Some(c);
    while let Some(i) = at {
        if !candidates[i].greedy {
            return false;
        }
        at = candidates[i].parent;
    }
    true
}

/// The `n`-th best score (the lowest that still makes a tree of `n`).
fn nth_best_score(candidates: &[Candidate], n: usize) -> f64 {
    let mut scores: Vec<f64> = candidates.iter().map(|c| c.score).collect();
    scores.sort_by(|a, b| b.total_cmp(a));
    scores
        .get(n.saturating_sub(1))
        .copied()
        .unwrap_or(f64::NEG_INFINITY)
}

/// The drafter's greedy path (every draft of a chain), then up to `budget` drafts in all
/// with the best-scored branches whose ancestors are in, as a tree in creation order
/// (parents first, a node's greedy child before its runner-up).
fn select(candidates: &[Candidate], budget: usize) -> DraftTree {
    let mut chosen: Vec<bool> = (0..candidates.len())
        .map(|c| is_greedy_path(candidates, c))
        .collect();
    let mut count = chosen.iter().filter(|&&c| c).count();
    let mut order: Vec<usize> = (0..candidates.len()).filter(|&c| !chosen[c]).collect();
    order.sort_by(|&a, &b| {
        candidates[b]
            .score
            .total_cmp(&candidates[a].score)
            .then(a.cmp(&b))
    });
    for c in order {
        if count >= budget || candidates[c].score < MIN_BRANCH_SCORE {
            break;
        }
        if candidates[c].parent.is_none_or(|p| chosen[p]) {
            chosen[c] = true;
            count += 1;
        }
    }
    let mut slot = vec![0u32; candidates.len()];
    let mut tree = DraftTree::default();
    for (c, candidate) in candidates.iter().enumerate() {
        if chosen[c] {
            tree.tokens.push(candidate.token);
            tree.parents.push(candidate.parent.map_or(0, |p| slot[p]));
            slot[c] = tree.tokens.len() as u32;
        }
    }
    tree
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranked(best: (u32, f32), runner_up: (u32, f32)) -> TopTwo {
        TopTwo {
            best,
            runner_up: Some(runner_up),
        }
    }

    #[test]
    fn the_tree_is_the_best_scored_candidates_with_their_ancestors() {
        let mut candidates = Vec::new();
        // Root: 5 (sure) or 6.
        propose(&mut candidates, None, 0, 1.0, &ranked((5, 10.0), (6, 0.0)));
        // Under 5: 7 or 8, nearly even.
        let sure = candidates[0].score;
        propose(
            &mut candidates,
            Some(0),
            1,
            sure,
            &ranked((7, 1.0), (8, 0.9)),
        );
        let tree = select(&candidates, 3);
        assert_eq!(tree.tokens, vec![5, 7, 8]);
        assert_eq!(tree.parents, vec![0, 1, 1]);
        assert!(tree.check().is_ok());
        // The greedy path always; no branch past the budget or below the least score.
        let tree = select(&candidates, 2);
        assert_eq!((tree.tokens, tree.parents), (vec![5, 7], vec![0, 1]));
        let tree = select(&candidates, 9);
        assert_eq!(tree.tokens, vec![5, 7, 8], "6 scores below the least");
    }

    #[test]
    fn a_committed_path_is_found_among_the_nodes_that_ran() {
        let run = RunTree {
            tokens: vec![1, 5, 6, 7],
            parents: vec![0, 0, 1],
        };
        assert_eq!(run.path_of(&[1, 5, 7, 9]), vec![0, 1, 3]);
        assert_eq!(run.path_of(&[1, 6]), vec![0, 2]);
        assert_eq!(run.path_of(&[1, 9]), vec![0]);
        assert!(run.path_of(&[2]).is_empty());
    }
}
