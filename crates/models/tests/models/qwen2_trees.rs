//! Token trees on the Qwen2 CPU engine (tiny random GGUF files written by the test): every
//! node of a tree run in one forward is bit for bit its path run token by token, however the
//! tree is split into forwards and beside whatever other rows, and keeping a path leaves the
//! cache as if only the path had run.

use crate::common::path_to;
use crate::qwen2_support::{compare, max_abs, Rng, TempGguf, TinyLayout, TinySpec};
use candle_core::{Device, Tensor};
use specd_models::qwen2::{Backend, BlockRow, KvCache, LoadOptions, Qwen2Model};
use specd_models::CausalLm;

fn layouts() -> [TinySpec; 3] {
    [
        TinySpec::default(),
        TinySpec::k_quants(),
        TinySpec {
            layout: TinyLayout::AllF32,
            ..TinySpec::default()
        },
    ]
}

/// A random tree of `nodes` nodes (node `j + 1`'s parent is `parents[j]`).
fn random_parents(rng: &mut Rng, nodes: usize) -> Vec<u32> {
    (1..nodes)
        .map(|j| (rng.next_u64() % j as u64) as u32)
        .collect()
}

fn prefilled(model: &Qwen2Model, prompt: &[u32]) -> KvCache {
    let mut cache = model.new_cache().unwrap();
    model.forward_block(prompt, &mut cache).unwrap();
    cache
}

/// Logits of a tree's nodes run after the cache (`splits`: the forwards' node counts).
fn tree_logits(
    model: &Qwen2Model,
    cache: &mut KvCache,
    tokens: &[u32],
    parents: &[u32],
    splits: &[usize],
) -> Tensor {
    let mut parts = Vec::new();
    let mut done = 0;
    for &count in splits {
        let end = done + count;
        let mut rows = [BlockRow {
            cache: &mut *cache,
            tokens: &tokens[done..end],
            parents: &parents[..end - 1],
        }];
        let hidden = model
            .forward(&mut rows, specd_models::OutputRows::All)
            .unwrap();
        parts.push(model.logits(&hidden[0]).unwrap());
        done = end;
    }
    Tensor::cat(&parts, 0).unwrap()
}

#[test]
fn every_node_of_a_tree_is_its_path_run_token_by_token() {
    for spec in layouts() {
        let file = TempGguf::tiny(&format!("tree-paths-{:?}", spec.layout), &spec);
        let model = Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
        assert!(model.supports_trees());
        let mut rng = Rng::new(11);
        for (case, nodes) in [1usize, 2, 5, 9, 14].into_iter().enumerate() {
            let prompt = rng.tokens(5 + case, spec.vocab);
            let tokens = rng.tokens(nodes, spec.vocab);
            let parents = random_parents(&mut rng, nodes);
            let mut cache = prefilled(&model, &prompt);
            let whole = tree_logits(&model, &mut cache, &tokens, &parents, &[nodes]);
            // Grown over several forwards (a drafter's levels): the same logits.
            let splits: Vec<usize> = match nodes {
                1 => vec![1],
                n => vec![1, (n - 1) / 2, n - 1 - (n - 1) / 2]
                    .into_iter()
                    .filter(|&c| c > 0)
                    .collect(),
            };
            let mut grown_cache = prefilled(&model, &prompt);
            let grown = tree_logits(&model, &mut grown_cache, &tokens, &parents, &splits);
            assert_eq!(
                compare(&whole, &grown).0,
                0,
                "{:?}: split {splits:?}",
                spec.layout
            );
            for node in 0..nodes {
                let path = path_to(&parents, node);
                let mut alone = prefilled(&model, &prompt);
                let mut last = None;
                for &at in &path {
                    last = Some(model.forward_block(&[tokens[at]], &mut alone).unwrap());
                }
                let (differing, max_diff) =
                    compare(&whole.narrow(0, node, 1).unwrap(), &last.unwrap());
                assert_eq!(
                    differing, 0,
                    "{:?}: node {node} of {parents:?} (path {path:?}) differs by {max_diff:e}",
                    spec.layout
                );
            }
        }
    }
}

#[test]
fn keeping_a_path_leaves_the_cache_of_the_path_alone() {
    let spec = TinySpec::default();
    let file = TempGguf::tiny("tree-keep-path", &spec);
    let model = Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
    let mut rng = Rng::new(12);
    let prompt = rng.tokens(9, spec.vocab);
    let tokens = rng.tokens(10, spec.vocab);
    let parents = vec![0, 1, 0, 3, 2, 4, 4, 6, 1];
    let next = rng.tokens(3, spec.vocab);
    for node in [0usize, 5, 8, 9] {
        let path = path_to(&parents, node);
        let mut cache = prefilled(&model, &prompt);
        tree_logits(&model, &mut cache, &tokens, &parents, &[tokens.len()]);
        model.keep_path(&mut cache, prompt.len(), &path).unwrap();
        assert_eq!(cache.len(), prompt.len() + path.len());
        let after = model.forward_block(&next, &mut cache).unwrap();

        let mut straight = prefilled(&model, &prompt);
        let walked: Vec<u32> = path.iter().map(|&at| tokens[at]).collect();
        model.forward_block(&walked, &mut straight).unwrap();
        let expected = model.forward_block(&next, &mut straight).unwrap();
        assert_eq!(compare(&after, &expected).0, 0, "path {path:?}");
    }
    // A path that is not one of the block is refused, and the cache is left alone.
    let mut cache = prefilled(&model, &prompt);
    tree_logits(&model, &mut cache, &tokens, &parents, &[tokens.len()]);
    let held = cache.len();
    assert!(model.keep_path(&mut cache, prompt.len(), &[1, 2]).is_err());
    assert!(model
        .keep_path(&mut cache, prompt.len(), &[0, 2, 1])
        .is_err());
    assert_eq!(cache.len(), held);
}

#[test]
fn a_tree_row_beside_chains_is_the_tree_alone() {
    let spec = TinySpec::default();
    let file = TempGguf::tiny("tree-batched", &spec);
    let model = Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
    let mut rng = Rng::new(13);
    let (prompt_a, prompt_b) = (rng.tokens(6, spec.vocab), rng.tokens(17, spec.vocab));
    let tree = rng.tokens(7, spec.vocab);
    let parents = vec![0, 0, 1, 2, 2, 3];
    let chain = rng.tokens(4, spec.vocab);

    let mut alone = prefilled(&model, &prompt_a);
    let tree_alone = tree_logits(&model, &mut alone, &tree, &parents, &[tree.len()]);
    let mut chain_alone_cache = prefilled(&model, &prompt_b);
    let chain_alone = model.forward_block(&chain, &mut chain_alone_cache).unwrap();

    let (mut a, mut b) = (prefilled(&model, &prompt_a), prefilled(&model, &prompt_b));
    let mut rows = [
        BlockRow::chain(&mut b, &chain),
        BlockRow {
            cache: &mut a,
            tokens: &tree,
            parents: &parents,
        },
    ];
    let batched = model.forward_batch(&mut rows).unwrap();
    assert_eq!(compare(&batched[0], &chain_alone).0, 0);
    assert_eq!(compare(&batched[1], &tree_alone).0, 0);
}

#[test]
fn a_malformed_tree_is_refused_naming_the_parents() {
    let spec = TinySpec::default();
    let file = TempGguf::tiny("tree-malformed", &spec);
    let model = Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
    let tokens = [1u32, 2, 3];
    for parents in [vec![0u32, 2], vec![0], vec![0, 1, 2, 3, 4, 5]] {
        let mut cache = prefilled(&model, &[4, 5]);
        let mut rows = [BlockRow {
            cache: &mut cache,
            tokens: &tokens,
            parents: &parents,
        }];
        let err = model.forward_batch(&mut rows).unwrap_err().to_string();
        assert!(err.contains("parents"), "{parents:?}: {err}");
        assert_eq!(cache.len(), 2, "a refused block leaves the cache alone");
    }
}

/// The candle path (CUDA and Metal; runnable on CPU as here) verifies trees too: each node
/// within float noise of its path run token by token on candle, and of the engine's node;
/// keeping a path leaves candle's cache as the path alone would.
#[test]
fn the_candle_path_verifies_trees_and_keeps_paths() {
    let spec = TinySpec {
        layout: TinyLayout::AllF32,
        ..TinySpec::default()
    };
    let file = TempGguf::tiny("tree-candle", &spec);
    let options = LoadOptions {
        backend: Backend::Candle,
        warm_up: false,
        ..LoadOptions::default()
    };
    let candle = Qwen2Model::load_with(file.path(), &Device::Cpu, &options).unwrap();
    assert!(candle.engine_info().is_none() && candle.supports_trees());
    let engine = Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
    let mut rng = Rng::new(14);
    let prompt = rng.tokens(7, spec.vocab);
    let tokens = rng.tokens(10, spec.vocab);
    let parents = vec![0, 1, 0, 3, 2, 4, 4, 6, 1];
    let close = |a: &Tensor, b: &Tensor, what: &str| {
        let (_, max_diff) = compare(a, b);
        let tolerance = 1e-4 * max_abs(b).max(1.0);
        assert!(max_diff < tolerance, "{what}: differs by {max_diff}");
    };

    let mut cache = prefilled(&candle, &prompt);
    let whole = tree_logits(&candle, &mut cache, &tokens, &parents, &[tokens.len()]);
    let mut engine_cache = prefilled(&engine, &prompt);
    let on_engine = tree_logits(&engine, &mut engine_cache, &tokens, &parents, &[4, 6]);
    close(&whole, &on_engine, "candle and engine trees");
    for node in 0..tokens.len() {
        let path = path_to(&parents, node);
        let mut alone = prefilled(&candle, &prompt);
        let mut last = None;
        for &at in &path {
            last = Some(candle.forward_block(&[tokens[at]], &mut alone).unwrap());
        }
        let what = format!("node {node} (path {path:?})");
        close(&whole.narrow(0, node, 1).unwrap(), &last.unwrap(), &what);
    }

    let next = rng.tokens(3, spec.vocab);
    for node in [0usize, 5, 9] {
        let path = path_to(&parents, node);
        let mut cache = prefilled(&candle, &prompt);
        tree_logits(&candle, &mut cache, &tokens, &parents, &[tokens.len()]);
        candle.keep_path(&mut cache, prompt.len(), &path).unwrap();
        assert_eq!(cache.len(), prompt.len() + path.len());
        let after = candle.forward_block(&next, &mut cache).unwrap();
        let mut straight = prefilled(&candle, &prompt);
        let walked: Vec<u32> = path.iter().map(|&at| tokens[at]).collect();
        candle.forward_block(&walked, &mut straight).unwrap();
        let expected = candle.forward_block(&next, &mut straight).unwrap();
        close(&after, &expected, &format!("after keeping {path:?}"));
    }
}
