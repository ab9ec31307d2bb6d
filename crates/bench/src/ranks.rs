//! Where the target's greedy tokens rank among a draft model's choices, per prompt kind, and
//! so what token trees could add to a chain on this pair before any tree is run.
//!
//! A tree that offers a node's top `k` drafter choices keeps going wherever the target's
//! token is among them; a chain is `k = 1`. Run over the target's own greedy output (the
//! plain generation, end-of-sequence ignored as every mode here ignores it), the ranks give,
//! for each `k`, the tokens a round would emit if every node of a full `k`-ary tree of the
//! chain's depth were verified: an upper bound for any tree of that depth that offers at
//! most `k` choices per node, at the price of its node count. The bound for `k = 1` is the
//! chain's own tokens per round, a check of the measurement against the sweep's.
//!
//! Full trees price every node; a tree is judged at a node budget. For each budget the best
//! *fixed-shape* tree (Sequoia's kind: the same shape every round) is the `n` rank paths the
//! target's tokens followed most often, each path a node (the path `2nd, 1st` is the first
//! level's runner-up and its own greedy child); its tokens per round, beside the chain of as
//! many nodes, bound every fixed shape of that budget on these outputs, the fitted shape
//! included (it is fitted to the very rounds it is scored on). Trees shaped per round by the
//! drafter's confidence (EAGLE-2's kind) are not bounded by it.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use serde_json::{json, Value};
use specd_models::qwen2::Qwen2Model;
use specd_models::{CausalLm, OutputRows, SeqBlock};
use specd_verifier::{LocalVerifier, Qwen2Target, TargetModel, VerifierLimits};

use super::embedded::{EmbeddedDrafter, EmbeddedSuite};
use super::prompts::{self, Prompt};
use super::report::ModeResult;

/// Ranks counted one by one; higher ranks are counted together.
const RANKS: usize = 4;
/// The widest tree whose bound is reported (choices per node).
const WIDEST: usize = 3;
/// Node budgets of the best fixed-shape trees reported.
const BUDGETS: [usize; 6] = [3, 4, 6, 8, 12, 16];

/// The ranks of one kind's prompts.
#[derive(Debug)]
struct KindRanks {
    kind: String,
    /// Per generated token: its rank among the drafter's logits after the same context
    /// (0: the drafter's greedy choice), `usize::MAX` where the drafter cannot propose it.
    ranks: Vec<Vec<usize>>,
}

impl KindRanks {
    fn positions(&self) -> usize {
        self.ranks.iter().map(Vec::len).sum()
    }

    /// Tokens at each rank below [`RANKS`], then all the others.
    fn histogram(&self) -> [usize; RANKS + 1] {
        let mut counts = [0; RANKS + 1];
        for &rank in self.ranks.iter().flatten() {
            counts[rank.min(RANKS)] += 1;
        }
        counts
    }

    /// Tokens per round of a full `k`-ary tree of `depth` levels, averaged over rounds
    /// starting at every generated position: the bonus token, then the drafts up to the
    /// first position whose token is not among the drafter's top `k`.
    fn tokens_per_round(&self, k: usize, depth: usize) -> f64 {
        let mut rounds = 0usize;
        let mut tokens = 0usize;
        for ranks in &self.ranks {
            for start in 0..ranks.len() {
                let accepted = ranks[start..]
                    .iter()
                    .take(depth)
                    .take_while(|&&rank| rank < k)
                    .count();
                rounds += 1;
                tokens += 1 + accepted;
            }
        }
        tokens as f64 / rounds.max(1) as f64
    }

    /// Tokens per round of the best tree of `nodes` drafts that has the same shape every
    /// round, and its depth. A node is a path of ranks from the root (the bonus); a round
    /// accepts the nodes its target tokens' ranks begin with. The best shape holds the
    /// `nodes` paths most rounds begin with, which is a tree: no path is begun more often
    /// than the path it extends, and among equals the shorter comes first.
    fn best_fixed_tree(&self, nodes: usize) -> (f64, usize) {
        let mut begun: HashMap<&[usize], usize> = HashMap::new();
        let mut rounds = 0usize;
        for ranks in &self.ranks {
            for start in 0..ranks.len() {
                rounds += 1;
                let path = &ranks[start..(start + nodes).min(ranks.len())];
                // Past a token the drafter cannot propose no node is accepted.
                let reach = path.iter().take_while(|&&rank| rank != usize::MAX).count();
                for depth in 1..=reach {
                    *begun.entry(&path[..depth]).or_default() += 1;
                }
            }
        }
        let mut paths: Vec<(&[usize], usize)> = begun.into_iter().collect();
        paths.sort_by(|a, b| {
            b.1.cmp(&a.1)
                .then(a.0.len().cmp(&b.0.len()))
                .then(a.0.cmp(b.0))
        });
        let chosen = &paths[..nodes.min(paths.len())];
        let accepted: usize = chosen.iter().map(|(_, count)| count).sum();
        let depth = chosen.iter().map(|(path, _)| path.len()).max().unwrap_or(0);
        (1.0 + accepted as f64 / rounds.max(1) as f64, depth)
    }
}

/// Nodes of a full `k`-ary tree of `depth` levels below its root.
fn full_tree_nodes(k: usize, depth: usize) -> usize {
    (1..=depth).map(|d| k.pow(d as u32)).sum()
}

/// The plain generation of `prompt`: greedy, `max_tokens` long, through the round loop as
/// every plain mode of the bench runs it.
async fn plain(
    suite: &EmbeddedSuite<Qwen2Target>,
    prompt: &[u32],
    max_tokens: usize,
    eos: &[u32],
) -> Result<Vec<u32>> {
    let mut mode = ModeResult::new("plain");
    suite.run(prompt, max_tokens, None, eos, &mut mode).await?;
    mode.runs
        .pop()
        .map(|run| run.output)
        .context("ranks: the plain generation recorded no run")
}

/// Each token of `continuation`'s rank under `drafter` after `prompt` and the tokens before
/// it, among the drafter's first `draft_vocab` ids.
fn drafter_ranks(
    drafter: &Qwen2Model,
    draft_vocab: usize,
    prompt: &[u32],
    continuation: &[u32],
) -> Result<Vec<usize>> {
    let mut context = prompt.to_vec();
    context.extend_from_slice(continuation);
    context.pop();
    let mut cache = drafter.new_cache()?;
    let hidden = drafter.forward(
        &mut [SeqBlock::chain(&mut cache, &context)],
        OutputRows::All,
    )?;
    let rows = drafter
        .logits(
            hidden
                .first()
                .context("ranks: the drafter returned no rows")?,
        )?
        .to_vec2::<f32>()?;
    let first = prompt
        .len()
        .checked_sub(1)
        .context("ranks: an empty prompt has no position to rank after")?;
    continuation
        .iter()
        .enumerate()
        .map(|(i, &token)| {
            let row = rows
                .get(first + i)
                .context("ranks: the drafter returned too few rows")?;
            let row = &row[..draft_vocab.min(row.len())];
            Ok(match row.get(token as usize) {
                Some(&logit) if !logit.is_nan() => row.iter().filter(|&&x| x > logit).count(),
                _ => usize::MAX,
            })
        })
        .collect()
}

/// Measures the ranks over `prompts` and reports them per kind, with the bounds of trees of
/// `depth` levels (the chain's drafts per round).
pub async fn run(
    target: Arc<Qwen2Target>,
    drafter: &Qwen2Model,
    draft_vocab: usize,
    prompts: &[Prompt],
    max_tokens: usize,
    depth: usize,
    as_json: bool,
) -> Result<()> {
    let mut kinds: Vec<KindRanks> = prompts::kinds(prompts)
        .into_iter()
        .map(|kind| KindRanks {
            kind,
            ranks: Vec::new(),
        })
        .collect();
    let eos = target.eos_token_ids().to_vec();
    let suite = EmbeddedSuite::new(
        LocalVerifier::new(target, VerifierLimits::default()),
        EmbeddedDrafter::Ngram,
    );
    for prompt in prompts {
        let continuation = plain(&suite, &prompt.ids, max_tokens, &eos).await?;
        let ranks = drafter_ranks(drafter, draft_vocab, &prompt.ids, &continuation)?;
        if let Some(kind) = kinds.iter_mut().find(|k| k.kind == prompt.kind) {
            kind.ranks.push(ranks);
        }
    }
    let report = Value::Array(kinds.iter().map(|k| kind_json(k, depth)).collect());
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", table(&kinds, depth));
    }
    Ok(())
}

fn kind_json(kind: &KindRanks, depth: usize) -> Value {
    let bounds: Vec<Value> = (1..=WIDEST)
        .map(|k| {
            json!({
                "choices_per_node": k,
                "nodes": full_tree_nodes(k, depth),
                "tokens_per_round": kind.tokens_per_round(k, depth),
            })
        })
        .collect();
    let fixed: Vec<Value> = BUDGETS
        .iter()
        .map(|&nodes| {
            let (tokens, tree_depth) = kind.best_fixed_tree(nodes);
            json!({
                "nodes": nodes,
                "tokens_per_round": tokens,
                "depth": tree_depth,
                "chain_tokens_per_round": kind.tokens_per_round(1, nodes),
            })
        })
        .collect();
    json!({
        "kind": kind.kind,
        "positions": kind.positions(),
        "rank_counts": kind.histogram(),
        "depth": depth,
        "full_trees": bounds,
        "best_fixed_trees": fixed,
    })
}

fn table(kinds: &[KindRanks], depth: usize) -> String {
    let mut out = format!(
        "target tokens by rank among the drafter's choices; tokens per round of full trees \
         of depth {depth} (k choices per node, nodes)\n"
    );
    out.push_str(&format!(
        "{:>8} {:>6} {:>7} {:>7} {:>7} {:>7} {:>7}",
        "kind", "tokens", "rank 1", "rank 2", "rank 3", "rank 4", "lower"
    ));
    for k in 1..=WIDEST {
        out.push_str(&format!(
            " {:>12}",
            format!("k={k} ({})", full_tree_nodes(k, depth))
        ));
    }
    out.push('\n');
    for kind in kinds {
        let total = kind.positions().max(1) as f64;
        out.push_str(&format!("{:>8} {:>6}", kind.kind, kind.positions()));
        for count in kind.histogram() {
            out.push_str(&format!(" {:>6.1}%", 100.0 * count as f64 / total));
        }
        for k in 1..=WIDEST {
            out.push_str(&format!(" {:>12.2}", kind.tokens_per_round(k, depth)));
        }
        out.push('\n');
    }
    out.push_str(
        "tokens per round of the best fixed-shape tree of n drafts (its depth) / the chain of \
         n drafts\n",
    );
    out.push_str(&format!("{:>8}", "kind"));
    for nodes in BUDGETS {
        out.push_str(&format!(" {:>16}", format!("n={nodes}")));
    }
    out.push('\n');
    for kind in kinds {
        out.push_str(&format!("{:>8}", kind.kind));
        for nodes in BUDGETS {
            let (tokens, tree_depth) = kind.best_fixed_tree(nodes);
            let cell = format!(
                "{tokens:.2} ({tree_depth}) / {:.2}",
                kind.tokens_per_round(1, nodes)
            );
            out.push_str(&format!(" {cell:>16}"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_stops_at_the_first_token_outside_the_offered_choices() {
        let kind = KindRanks {
            kind: "prose".into(),
            ranks: vec![vec![0, 1, 0, 5]],
        };
        // Chain, depth 2: rounds at 0..4 accept 1, 0, 1, 0 drafts.
        assert_eq!(kind.tokens_per_round(1, 2), 1.5);
        // Two choices: 2, 2, 1, 0.
        assert_eq!(kind.tokens_per_round(2, 2), 2.25);
        assert_eq!(kind.histogram(), [2, 1, 0, 0, 1]);
        assert_eq!(full_tree_nodes(2, 3), 14);
        assert_eq!(full_tree_nodes(1, 3), 3);
    }

    #[test]
    fn the_best_fixed_tree_holds_the_paths_begun_most_often() {
        let kind = KindRanks {
            kind: "prose".into(),
            ranks: vec![vec![1, 0, 1, 0, 0]],
        };
        // Within two drafts, rounds at 0..5 begin with the rank paths (2nd, 1st), (1st,
        // 2nd), (2nd, 1st), (1st, 1st) and (1st): the first level's greedy node is begun 3
        // times, its runner-up 2, the runner-up's greedy child 2, and the others once.
        assert_eq!(kind.best_fixed_tree(1), (1.0 + 3.0 / 5.0, 1));
        assert_eq!(kind.best_fixed_tree(2), (1.0 + 5.0 / 5.0, 1));
        assert_eq!(kind.best_fixed_tree(3), (1.0 + 7.0 / 5.0, 2));
        // The chain of two drafts accepts 0, 1, 0, 2, 1 drafts in those rounds.
        assert_eq!(kind.tokens_per_round(1, 2), 1.0 + 4.0 / 5.0);
        // The chain is a fixed shape, so the best shape of a budget is never worse.
        for nodes in 1..=6 {
            assert!(kind.best_fixed_tree(nodes).0 >= kind.tokens_per_round(1, nodes));
        }
    }
}
