//! Token trees grown level by level as EAGLE-2 grows them, for any drafter that can run a
//! node (feed its token after its parent) and rank what follows it: each level runs the
//! likeliest candidates so far, and each run node proposes its greedy token and its
//! runner-up. A candidate's score is its parent's times its share of the pair: the logistic
//! of the logit margin for the greedy token, the rest for the runner-up (a two-way estimate,
//! like the rejection branches'; it orders candidates well without the full softmax). The
//! round's tree is the best-scored candidates, which always include their ancestors (a child
//! never scores above its parent), and always the drafter's greedy path: a tree holds the
//! chain the drafter would have drafted.
//!
//! A drafter that learns which of its drafts the target committed calibrates the shares
//! ([`Calibration`]): a share becomes how often the target took choices of that rank and
//! share in the session so far, so branches the target never takes stop costing rows.

use specd_core::tree::walk;
use specd_core::DraftTree;
use specd_models::TopTwo;

/// Candidates run per level at most: a level costs one forward of this many rows, which
/// on a memory-bound CPU costs little more than one.
pub const LEVEL_WIDTH: usize = 4;

/// Least score of a branch worth a verify row (and a drafter row to grow it) where the
/// round loop does not price rows: below it the row costs more than the token it may bring.
/// On the real pair, 0.1 to 0.3 all gave about the same tokens per round on prose; 0.1
/// keeps the most.
pub const DEFAULT_LEAST_CHANCE: f64 = 0.1;

/// How far a round's tree may branch beside its chain: at most `nodes` branch drafts, each
/// with a score (its path's calibrated chance) of at least `least_chance`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Branching {
    pub nodes: usize,
    pub least_chance: f64,
}

impl Branching {
    /// Up to `nodes` branches, each as likely as `least_chance` (a probability; `None` or
    /// anything not in `0..=1` keeps the default).
    pub fn new(nodes: usize, least_chance: Option<f64>) -> Self {
        let least_chance = least_chance
            .filter(|chance| (0.0..=1.0).contains(chance))
            .unwrap_or(DEFAULT_LEAST_CHANCE);
        Self {
            nodes,
            least_chance,
        }
    }
}

/// Share bins of a calibration: tenths.
const BINS: usize = 10;
/// Pseudo-observations at the drafter's own share in each bin: a session starts from the
/// two-way shares and moves off them as it sees what the target takes.
const PRIOR: f64 = 4.0;

/// How often the target took the drafter's first and second choices, by the two-way share
/// the drafter gave them: `(offered, taken)` per rank and share bin.
#[derive(Clone, Debug, Default)]
pub struct Calibration {
    bins: [[(f64, f64); BINS]; 2],
}

impl Calibration {
    fn bin(&mut self, greedy: bool, share: f64) -> &mut (f64, f64) {
        &mut self.bins[usize::from(greedy)][bin_of(share)]
    }

    /// The chance that the target takes a choice of this rank and share.
    pub fn chance(&self, greedy: bool, share: f64) -> f64 {
        let (offered, taken) = self.bins[usize::from(greedy)][bin_of(share)];
        (taken + PRIOR * share) / (offered + PRIOR)
    }

    /// Learns from a verified tree and its offers which drafts the target took: at each
    /// node of the committed path (`committed`: the bonus, then the accepted drafts), every
    /// child was offered and the committed one taken.
    pub fn learn(&mut self, tree: &DraftTree, offers: &[Offer], committed: &[u32]) {
        let path = walk(
            &tree.tokens,
            &tree.parents,
            committed.get(1..).unwrap_or(&[]),
        );
        for (depth, &node) in path.iter().enumerate() {
            let taken = path.get(depth + 1).map(|&slot| slot - 1);
            for j in (0..tree.tokens.len()).filter(|&j| tree.parent(j) == node) {
                let Some(offer) = offers.get(j) else { return };
                let cell = self.bin(offer.greedy, offer.share);
                cell.0 += 1.0;
                if taken == Some(j) {
                    cell.1 += 1.0;
                }
            }
        }
    }
}

/// The bin of a share in `0..=1`.
fn bin_of(share: f64) -> usize {
    ((share * BINS as f64) as usize).min(BINS - 1)
}

/// How a draft of a verified tree was proposed: as its parent's first choice or not, with
/// the two-way share the drafter gave it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Offer {
    pub greedy: bool,
    pub share: f64,
}

/// A grown tree: the tree to verify, how each of its drafts was offered, and every node
/// that ran.
#[derive(Clone, Debug, Default)]
pub struct Grown {
    pub tree: DraftTree,
    pub offers: Vec<Offer>,
    pub ran: RunTree,
}

/// The nodes a tree draft ran, from the bonus (node 0), in the order they ran.
#[derive(Debug, Clone, Default)]
pub struct RunTree {
    pub tokens: Vec<u32>,
    /// Node `j + 1`'s parent node.
    pub parents: Vec<u32>,
}

impl RunTree {
    /// The nodes of `committed` (the bonus, then the accepted path) that ran, root first.
    pub fn path_of(&self, committed: &[u32]) -> Vec<usize> {
        match (committed.split_first(), self.tokens.split_first()) {
            (Some((bonus, accepted)), Some((root, drafts))) if bonus == root => {
                walk(drafts, &self.parents, accepted)
            }
            _ => Vec::new(),
        }
    }
}

/// Grows a tree of at most `levels` levels and `levels + branching.nodes` drafts after
/// `bonus`, whose own proposals are `root`, scoring choices by `calibration`; a branch
/// scoring below `branching.least_chance` neither runs nor is verified. `run(tree,
/// first)` runs the nodes `first..` of `tree` (each after its parent, which ran before) and
/// ranks what follows each of them, in order.
pub fn grow<E>(
    bonus: u32,
    root: &TopTwo,
    levels: usize,
    branching: Branching,
    calibration: &Calibration,
    mut run: impl FnMut(&RunTree, usize) -> Result<Vec<TopTwo>, E>,
) -> Result<Grown, E> {
    let budget = levels + branching.nodes;
    let least = branching.least_chance;
    let mut ran = RunTree {
        tokens: vec![bonus],
        parents: Vec::new(),
    };
    let mut candidates: Vec<Candidate> = Vec::new();
    let offer = |candidates: &mut Vec<Candidate>, parent, depth, score, ranked: &TopTwo| {
        propose(candidates, calibration, parent, depth, score, ranked)
    };
    offer(&mut candidates, None, 0, 1.0, root);
    for _level in 1..levels {
        // The greedy path's next node, and the best other candidates not yet run whose
        // children could still be drafts and make the tree.
        let open = |c: &usize| candidates[*c].ran.is_none() && candidates[*c].depth < levels;
        let (mut frontier, mut others): (Vec<usize>, Vec<usize>) = (0..candidates.len())
            .filter(open)
            .partition(|&c| is_greedy_path(&candidates, c));
        let cut = nth_best_score(&candidates, budget).max(least);
        others.retain(|&c| candidates[c].score >= cut);
        others.sort_by(|&a, &b| candidates[b].score.total_cmp(&candidates[a].score));
        frontier.extend(others.into_iter().take(LEVEL_WIDTH - 1));
        if frontier.is_empty() {
            break;
        }
        // Parents run before children: frontier order by creation keeps them so.
        frontier.sort_unstable();
        let first = ran.tokens.len();
        for &c in &frontier {
            // A candidate's parent is a run node or the bonus.
            let parent_node = candidates[c]
                .parent
                .and_then(|p| candidates[p].ran)
                .unwrap_or(0);
            ran.parents.push(parent_node as u32);
            ran.tokens.push(candidates[c].token);
            candidates[c].ran = Some(ran.tokens.len() - 1);
        }
        let ranked = run(&ran, first)?;
        for (&c, ranked) in frontier.iter().zip(&ranked) {
            let (depth, score) = (candidates[c].depth, candidates[c].score);
            offer(&mut candidates, Some(c), depth, score, ranked);
        }
    }
    let (tree, chosen) = select(&candidates, budget, least);
    let offers = chosen
        .iter()
        .map(|&c| Offer {
            greedy: candidates[c].greedy,
            share: candidates[c].share,
        })
        .collect();
    Ok(Grown { tree, offers, ran })
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
    /// Its two-way share of its parent's next token, as the drafter gave it.
    share: f64,
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

/// The two proposals of a node at `depth` (0: the bonus) as candidates, each scored by its
/// parent's score times its calibrated chance.
fn propose(
    candidates: &mut Vec<Candidate>,
    calibration: &Calibration,
    parent: Option<usize>,
    depth: usize,
    score: f64,
    ranked: &TopTwo,
) {
    let (best, runner_up) = shares(ranked);
    let choices = std::iter::once((ranked.best.0, best, true))
        .chain(runner_up.map(|(token, share)| (token, share, false)));
    for (token, share, greedy) in choices {
        candidates.push(Candidate {
            token,
            parent,
            depth: depth + 1,
            score: score * calibration.chance(greedy, share),
            ran: None,
            greedy,
            share,
        });
    }
}

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
/// with the best-scored branches (none below `least`) whose ancestors are in, as a tree in creation order
/// (parents first, a node's greedy child before its runner-up), with the candidate of each
/// draft.
fn select(candidates: &[Candidate], budget: usize, least: f64) -> (DraftTree, Vec<usize>) {
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
        if count >= budget || candidates[c].score < least {
            break;
        }
        if candidates[c].parent.is_none_or(|p| chosen[p]) {
            chosen[c] = true;
            count += 1;
        }
    }
    let mut slot = vec![0u32; candidates.len()];
    let mut tree = DraftTree::default();
    let mut drafts = Vec::new();
    for (c, candidate) in candidates.iter().enumerate() {
        if chosen[c] {
            tree.tokens.push(candidate.token);
            tree.parents.push(candidate.parent.map_or(0, |p| slot[p]));
            slot[c] = tree.tokens.len() as u32;
            drafts.push(c);
        }
    }
    (tree, drafts)
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
        let calibration = Calibration::default();
        // Root: 5 (sure) or 6.
        let root = ranked((5, 10.0), (6, 0.0));
        propose(&mut candidates, &calibration, None, 0, 1.0, &root);
        // Under 5: 7 or 8, nearly even.
        let sure = candidates[0].score;
        let under = ranked((7, 1.0), (8, 0.9));
        propose(&mut candidates, &calibration, Some(0), 1, sure, &under);
        let (tree, _) = select(&candidates, 3, DEFAULT_LEAST_CHANCE);
        assert_eq!(tree.tokens, vec![5, 7, 8]);
        assert_eq!(tree.parents, vec![0, 1, 1]);
        assert!(tree.check().is_ok());
        // The greedy path always; no branch past the budget or below the least score.
        let (tree, _) = select(&candidates, 2, DEFAULT_LEAST_CHANCE);
        assert_eq!((tree.tokens, tree.parents), (vec![5, 7], vec![0, 1]));
        let (tree, _) = select(&candidates, 9, DEFAULT_LEAST_CHANCE);
        assert_eq!(tree.tokens, vec![5, 7, 8], "6 scores below the least");
        // Priced rows: free ones take even the unlikely 6, dear ones no branch at all.
        let (tree, _) = select(&candidates, 9, 0.0);
        assert_eq!(tree.tokens, vec![5, 6, 7, 8]);
        let (tree, _) = select(&candidates, 9, 0.6);
        assert_eq!((tree.tokens, tree.parents), (vec![5, 7], vec![0, 1]));
    }

    #[test]
    fn growing_runs_each_level_after_its_parents_and_keeps_the_greedy_path() {
        // Every node proposes (its token + 1) surely and (its token + 100) evenly at the
        // root only, so the root's runner-up is the one branch worth a row.
        let root = ranked((1, 0.0), (101, 0.0));
        let mut levels = Vec::new();
        let calibration = Calibration::default();
        let one = Branching::new(1, None);
        let grown = grow(0, &root, 3, one, &calibration, |ran: &RunTree, first| {
            levels.push(ran.tokens[first..].to_vec());
            let parents_ran = ran.parents[first - 1..]
                .iter()
                .all(|&p| (p as usize) < first);
            assert!(parents_ran, "a node ran before its parent");
            Ok::<_, ()>(
                ran.tokens[first..]
                    .iter()
                    .map(|&t| ranked((t + 1, 10.0), (t + 200, 0.0)))
                    .collect(),
            )
        })
        .unwrap();
        let (tree, ran) = (grown.tree, grown.ran);
        assert_eq!(levels, vec![vec![1, 101], vec![2, 102]]);
        assert_eq!(ran.tokens, vec![0, 1, 101, 2, 102]);
        // The chain 1, 2, 3 and the runner-up 101 beside its first draft.
        assert_eq!(tree.tokens, vec![1, 101, 2, 3]);
        assert_eq!(tree.parents, vec![0, 0, 1, 3]);
        assert_eq!(ran.path_of(&[0, 101, 102]), vec![0, 2, 4]);
    }

    #[test]
    fn runner_ups_the_target_never_takes_stop_making_the_tree() {
        let mut calibration = Calibration::default();
        let even = ranked((1, 0.0), (2, 0.0));
        let grow_one = |calibration: &Calibration| {
            grow(
                0,
                &even,
                1,
                Branching::new(1, None),
                calibration,
                |_: &RunTree, _| Ok::<_, ()>(Vec::new()),
            )
            .unwrap()
        };
        let first = grow_one(&calibration);
        assert_eq!(
            first.tree.tokens,
            vec![1, 2],
            "an even runner-up is offered at first"
        );
        assert_eq!(
            first.offers,
            vec![
                Offer {
                    greedy: true,
                    share: 0.5
                },
                Offer {
                    greedy: false,
                    share: 0.5
                }
            ]
        );
        // The target takes neither (its token was 3), then the first choice, over and over.
        calibration.learn(&first.tree, &first.offers, &[0]);
        for _ in 0..20 {
            calibration.learn(&first.tree, &first.offers, &[0, 1]);
        }
        assert!(calibration.chance(false, 0.5) < DEFAULT_LEAST_CHANCE);
        assert!(calibration.chance(true, 0.5) > 0.8);
        assert_eq!(grow_one(&calibration).tree.tokens, vec![1]);
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
