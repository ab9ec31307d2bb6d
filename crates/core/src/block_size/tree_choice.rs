//! Whether a request's next round verifies a token tree or a chain, from what each cost per
//! emitted token in this request.
//!
//! A tree's branches are extra verify rows and extra drafter rows; they pay only where the
//! drafter's second choices are often the target's (prose more than code, on the real pair:
//! see BENCHMARKS.md). The drafter's own confidence is not calibrated enough to price that,
//! so the choice is measured: both shapes are tried in the first rounds, the cheaper per
//! token is used, and the other is tried again now and then, since the text's nature
//! changes within a request.
//!
//! Within a tree, what a branch row is worth is priced the same way: one more verify row
//! costs the slope of the request's verify time by rows, and a token costs what a chain
//! spends per token, so a branch pays when its chance of being committed exceeds their
//! ratio ([`TreeChoice::least_branch_chance`], EAGLE-2's and Sequoia's expected tokens per
//! cost). Where rows are nearly free (a GPU, a lone request on a memory-bound CPU) trees
//! widen to their cap; where each row costs (a busy batch) only sure branches stay.

use std::time::Duration;

use super::forward_curve::ForwardCurve;

/// Rounds of each shape measured before the cheaper is preferred.
const PROBES: u32 = 2;
/// While one shape is preferred, every this many rounds the other is tried once.
const REPROBE_EVERY: u32 = 8;
/// How much of a shape's past rounds each new round keeps (a decay over rounds).
const KEEP: f64 = 0.8;
/// How far one verify moves the estimate of verify time at its row count.
const ROW_WEIGHT: f64 = 0.3;

/// One request's measured choice between trees and chains.
#[derive(Clone, Debug, Default)]
pub struct TreeChoice {
    tree: ShapeCost,
    chain: ShapeCost,
    /// Rounds since the last probe of the shape not preferred.
    since_probe: u32,
    /// Verify time by the rows a round verified (bonus, drafts and branches), trees and
    /// chains alike.
    verify_by_rows: ForwardCurve,
    /// Rows of the last chain round verified.
    chain_rows: usize,
}

/// A shape's recent rounds: their time and their tokens, each round weighted by how
/// recent it is. Their ratio is the time per token of those rounds together, which is what
/// throughput follows; an average of each round's own ratio would overweigh the rounds
/// that emitted one token.
#[derive(Clone, Copy, Debug, Default)]
struct ShapeCost {
    rounds: u32,
    seconds: f64,
    tokens: f64,
}

impl ShapeCost {
    fn record(&mut self, time: Duration, tokens: usize) {
        self.seconds = KEEP * self.seconds + time.as_secs_f64();
        self.tokens = KEEP * self.tokens + tokens.max(1) as f64;
        self.rounds += 1;
    }

    /// Seconds per emitted token.
    fn per_token(&self) -> f64 {
        self.seconds / self.tokens.max(f64::MIN_POSITIVE)
    }
}

impl TreeChoice {
    /// Whether the next round should verify a tree.
    pub fn next_is_tree(&mut self) -> bool {
        // Trees first: a chain's cost is what the request measured before branching.
        if self.tree.rounds < PROBES {
            return self.tree.rounds <= self.chain.rounds;
        }
        if self.chain.rounds < PROBES {
            return false;
        }
        let prefer_tree = self.tree.per_token() <= self.chain.per_token();
        self.since_probe += 1;
        if self.since_probe >= REPROBE_EVERY {
            self.since_probe = 0;
            return !prefer_tree;
        }
        prefer_tree
    }

    /// Books a drafting round: its shape, draft and verify time, and tokens emitted.
    pub fn record(&mut self, tree: bool, time: Duration, tokens: usize) {
        match tree {
            true => self.tree.record(time, tokens),
            false => self.chain.record(time, tokens),
        }
    }

    /// Books a drafting round's verify: the rows it verified and how long it took.
    pub fn record_verify(&mut self, tree: bool, rows: usize, time: Duration) {
        self.verify_by_rows.record(rows, time, ROW_WEIGHT);
        if !tree {
            self.chain_rows = rows;
        }
    }

    /// The least chance of being committed that makes a branch draft worth its verify row
    /// in a tree of up to `branches` branches beside the chain: the verify time one more
    /// row costs there (the slope from the chain's rows to the tree's) over the time a
    /// chain spends per token. `None` until verifies of two sizes and a chain's rounds
    /// were measured.
    pub fn least_branch_chance(&self, branches: usize) -> Option<f64> {
        if branches == 0 || self.chain.rounds == 0 || self.verify_by_rows.sizes() < 2 {
            return None;
        }
        let chain = self.verify_by_rows.seconds(self.chain_rows)?;
        let tree = self.verify_by_rows.seconds(self.chain_rows + branches)?;
        let per_row = ((tree - chain) / branches as f64).max(0.0);
        let per_token = self.chain.per_token();
        (per_token > 0.0).then(|| (per_row / per_token).min(1.0))
    }

    /// Rounds of each shape measured so far (trees, chains).
    pub fn rounds(&self) -> (u32, u32) {
        (self.tree.rounds, self.chain.rounds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::block_size::test_time::ms;

    /// Runs `rounds` rounds where a tree round costs `tree` ms and a chain `chain` ms per
    /// token; returns the tree rounds.
    fn run(tree: u64, chain: u64, rounds: usize) -> usize {
        let mut choice = TreeChoice::default();
        let mut trees = 0;
        for _ in 0..rounds {
            let is_tree = choice.next_is_tree();
            trees += usize::from(is_tree);
            choice.record(is_tree, ms(if is_tree { tree } else { chain }), 1);
        }
        trees
    }

    #[test]
    fn the_cheaper_shape_runs_most_rounds_and_the_other_is_probed() {
        let cheap_tree = run(30, 40, 50);
        assert!(cheap_tree > 40, "{cheap_tree}");
        let cheap_chain = run(40, 30, 50);
        assert!((2..10).contains(&cheap_chain), "{cheap_chain}");
    }

    #[test]
    fn the_shape_with_less_time_per_token_overall_wins() {
        // Chains: 10 ms rounds of one token or of three, in turn (5 ms a token overall, a
        // mean of per-round ratios 6.7 ms). Trees: 12 ms rounds of two tokens (6 ms a token).
        let mut choice = TreeChoice::default();
        let mut chain_round = 0;
        let mut trees = 0;
        for _ in 0..60 {
            let tree = choice.next_is_tree();
            if tree {
                trees += 1;
                choice.record(true, ms(12), 2);
            } else {
                chain_round += 1;
                choice.record(false, ms(10), if chain_round % 2 == 0 { 3 } else { 1 });
            }
        }
        assert!(trees < 15, "{trees} tree rounds");
    }

    #[test]
    fn a_branch_is_priced_at_a_rows_verify_time_over_a_chains_time_per_token() {
        let mut choice = TreeChoice::default();
        assert_eq!(choice.least_branch_chance(3), None);
        // Chains of 5 rows verify in 50 ms and emit 2 tokens in 80 ms rounds (40 ms a token);
        // trees of 8 rows verify in 56 ms: 2 ms a row, a branch pays from a chance of 0.05.
        choice.record(false, ms(80), 2);
        choice.record_verify(false, 5, ms(50));
        assert_eq!(
            choice.least_branch_chance(3),
            None,
            "one size: no slope yet"
        );
        choice.record(true, ms(86), 2);
        choice.record_verify(true, 8, ms(56));
        let chance = choice.least_branch_chance(3).unwrap();
        assert!((chance - 0.05).abs() < 1e-9, "{chance}");
        assert_eq!(choice.least_branch_chance(0), None);
        // Rows that cost more than tokens are worth: no branch pays.
        let mut busy = TreeChoice::default();
        busy.record(false, ms(10), 1);
        busy.record_verify(false, 2, ms(10));
        busy.record_verify(true, 3, ms(100));
        assert_eq!(busy.least_branch_chance(1), Some(1.0));
        // A tree that verified faster than the chain (noise) prices rows at nothing.
        let mut noisy = TreeChoice::default();
        noisy.record(false, ms(10), 1);
        noisy.record_verify(false, 4, ms(20));
        noisy.record_verify(true, 6, ms(18));
        assert_eq!(noisy.least_branch_chance(2), Some(0.0));
    }

    #[test]
    fn both_shapes_are_measured_first() {
        let mut choice = TreeChoice::default();
        let shapes: Vec<bool> = (0..4)
            .map(|_| {
                let tree = choice.next_is_tree();
                choice.record(tree, ms(10), 1);
                tree
            })
            .collect();
        assert_eq!(shapes, vec![true, false, true, false]);
        assert_eq!(choice.rounds(), (2, 2));
    }
}
