//! Token trees from a real draft model (a tiny random Qwen2 GGUF): whichever path of its
//! tree the target commits, a session that drafts trees proposes next what a session that
//! drafts chains would, and its tree always holds that chain.

use candle_core::Device;
use specd_core::{DraftTree, SamplingParams};
use specd_drafter::{
    DraftCarry, DraftEngine, DraftModelEngine, DraftStep, OpenSession, SessionSource,
};
use specd_models::qwen2::Qwen2Model;

use crate::qwen2_support::{Rng, TempGguf, TinySpec};

fn engine(file: &TempGguf) -> DraftModelEngine {
    let model = Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
    DraftModelEngine::new(model, "tiny".into(), 8)
}

/// The slots of the tree's first-child path (the drafter's greedy chain).
fn first_child_path(tree: &DraftTree) -> Vec<u32> {
    let mut chain = Vec::new();
    let mut at = 0usize;
    while let Some(j) = (0..tree.tokens.len()).find(|&j| tree.parent(j) == at) {
        chain.push(tree.tokens[j]);
        at = j + 1;
    }
    chain
}

/// A random root-first path of the tree, as its drafts.
fn random_path(tree: &DraftTree, rng: &mut Rng) -> Vec<u32> {
    let mut path = Vec::new();
    let mut at = 0usize;
    loop {
        let children: Vec<usize> = (0..tree.tokens.len())
            .filter(|&j| tree.parent(j) == at)
            .collect();
        // Stop early now and then, as a rejection does.
        if children.is_empty() || rng.next_u64().is_multiple_of(4) {
            return path;
        }
        let j = children[(rng.next_u64() % children.len() as u64) as usize];
        path.push(tree.tokens[j]);
        at = j + 1;
    }
}

#[test]
fn tree_sessions_propose_what_chain_sessions_do_after_any_path() {
    let file = TempGguf::tiny("tree-draft", &TinySpec::default());
    let (chains, trees) = (engine(&file), engine(&file));
    let context = vec![1u32, 2, 3, 4, 5, 6];
    let open = || OpenSession {
        sampling: SamplingParams::default(),
        committed_len: context.len(),
        source: SessionSource::Context(context.clone()),
        cache_scope: Default::default(),
    };
    let (mut a, mut b) = (chains.open(open()).unwrap(), trees.open(open()).unwrap());
    let mut rng = Rng::new(21);
    let mut bonus = 9u32;
    let mut committed_len = context.len();
    let mut branched_rounds = 0;
    let mut took_a_branch = 0;
    for round in 0..24 {
        let count = [3, 4, 2, 5, 1][round % 5];
        let branch_nodes = [3, 0, 5, 2][round % 4];
        let step = DraftStep {
            bonus,
            position: committed_len - 1,
            count,
            output_index_base: 0,
            branches: 0,
        };
        let chain = chains.draft(&mut a, step).unwrap();
        let tree = trees.draft_tree(&mut b, step, branch_nodes).unwrap();
        tree.check().unwrap();
        assert!(tree.depth() <= count, "round {round}");
        assert!(tree.tokens.len() <= count + branch_nodes, "round {round}");
        assert_eq!(first_child_path(&tree), chain, "round {round}: {tree:?}");
        branched_rounds += usize::from(tree.tokens.len() > chain.len());
        let accepted = random_path(&tree, &mut rng);
        took_a_branch += usize::from(!chain.starts_with(&accepted));
        let mut committed = vec![bonus];
        committed.extend_from_slice(&accepted);
        chains
            .apply(&mut a, DraftCarry::Tokens(committed.clone()))
            .unwrap();
        trees
            .apply(&mut b, DraftCarry::Tokens(committed.clone()))
            .unwrap();
        committed_len += committed.len();
        assert_eq!(trees.committed_len(&b), committed_len);
        bonus = (rng.next_u64() % 200) as u32;
    }
    // The random model is unsure enough to branch, and the walk took branches.
    assert!(branched_rounds > 5, "{branched_rounds}");
    assert!(took_a_branch > 2, "{took_a_branch}");
}
