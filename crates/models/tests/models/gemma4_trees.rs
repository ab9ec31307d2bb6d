//! Token trees on the Gemma 4 target (CPU f32, the committed fixtures, sliding window 8):
//! every node of a tree run in one forward is bit for bit its path run token by token,
//! however the tree is split into forwards and beside whatever other rows, also where paths
//! outgrow the sliding window; keeping a path leaves the cache as if only the path had run.

use crate::common::gemma4::{prefilled, prompts, rows, tokens};
use crate::common::{fixture_dir, path_to};
use candle_core::{DType, Device, Tensor};
use specd_models::gemma4::{BlockInput, Gemma4Model, OutputRows, SequenceCache};
use specd_models::CausalLm;

const TARGETS: [&str; 4] = [
    "target-full",
    "target-nople",
    "target-multimodal",
    "target-moe",
];

fn load(name: &str) -> Gemma4Model {
    Gemma4Model::load(&fixture_dir(name), DType::F32, &Device::Cpu).unwrap()
}

/// A pseudo-random tree of `nodes` nodes (node `j + 1`'s parent is `parents[j]`), leaning to
/// deep paths so that some outgrow the window.
fn random_parents(seed: u32, nodes: usize) -> Vec<u32> {
    let picks = tokens(seed, nodes, 1 << 20);
    (1..nodes)
        .map(|j| {
            let pick = picks[j] as usize;
            if pick.is_multiple_of(3) {
                (j - 1) as u32
            } else {
                (pick % j) as u32
            }
        })
        .collect()
}

/// Logits of a tree's nodes run after the cache (`splits`: the forwards' node counts).
fn tree_logits(
    model: &Gemma4Model,
    cache: &mut SequenceCache,
    tokens: &[u32],
    parents: &[u32],
    splits: &[usize],
) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    let mut done = 0;
    for &count in splits {
        let end = done + count;
        let mut block = [BlockInput {
            cache: &mut *cache,
            tokens: &tokens[done..end],
            parents: &parents[..end - 1],
        }];
        let hidden = model.forward(&mut block, OutputRows::All).unwrap();
        out.extend(rows(&model.logits(&hidden[0]).unwrap()));
        done = end;
    }
    out
}

fn step_logits(model: &Gemma4Model, cache: &mut SequenceCache, token: u32) -> Vec<f32> {
    let hidden: Tensor = model.forward_block(cache, &[token]).unwrap();
    rows(&model.logits(&hidden).unwrap()).remove(0)
}

#[test]
fn every_node_of_a_tree_is_its_path_run_token_by_token() {
    for name in TARGETS {
        let model = load(name);
        assert!(model.supports_trees());
        let vocab = model.config().vocab_size;
        for (p, prompt) in prompts(name).iter().enumerate() {
            for (case, nodes) in [1usize, 2, 5, 9, 14].into_iter().enumerate() {
                let seed = (p * 10 + case) as u32;
                let block = tokens(seed + 300, nodes, vocab);
                let parents = random_parents(seed, nodes);
                let mut cache = prefilled(&model, prompt);
                let whole = tree_logits(&model, &mut cache, &block, &parents, &[nodes]);
                // Grown over several forwards (a drafter's levels): the same logits.
                let splits: Vec<usize> = match nodes {
                    1 => vec![1],
                    n => [1, (n - 1) / 2, n - 1 - (n - 1) / 2]
                        .into_iter()
                        .filter(|&c| c > 0)
                        .collect(),
                };
                let mut grown_cache = prefilled(&model, prompt);
                let grown = tree_logits(&model, &mut grown_cache, &block, &parents, &splits);
                assert_eq!(whole, grown, "{name} prompt {p}: split {splits:?}");
                for (node, logits) in whole.iter().enumerate() {
                    let path = path_to(&parents, node);
                    let mut alone = prefilled(&model, prompt);
                    let mut last = Vec::new();
                    for &at in &path {
                        last = step_logits(&model, &mut alone, block[at]);
                    }
                    assert_eq!(
                        *logits, last,
                        "{name} prompt {p}: node {node} of {parents:?} (path {path:?})"
                    );
                }
            }
        }
    }
}

#[test]
fn keeping_a_path_leaves_the_cache_of_the_path_alone() {
    for name in ["target-full", "target-nople"] {
        let model = load(name);
        let vocab = model.config().vocab_size;
        // The long prompt has wrapped the sliding window; a path of 6 outgrows it again.
        let prompt = &prompts(name)[2];
        assert!(prompt.len() > model.config().sliding_window);
        let block = tokens(21, 12, vocab);
        let parents = vec![0, 1, 0, 3, 2, 4, 4, 6, 7, 9, 10];
        let next = tokens(22, 3, vocab);
        for node in [0usize, 5, 8, 11] {
            let path = path_to(&parents, node);
            let mut cache = prefilled(&model, prompt);
            let start = cache.len();
            tree_logits(&model, &mut cache, &block, &parents, &[block.len()]);
            model.keep_path(&mut cache, start, &path).unwrap();
            assert_eq!(cache.len(), start + path.len());
            let after = rows(&model.forward_block(&mut cache, &next).unwrap());

            let mut straight = prefilled(&model, prompt);
            let walked: Vec<u32> = path.iter().map(|&at| block[at]).collect();
            model.forward_block(&mut straight, &walked).unwrap();
            let expected = rows(&model.forward_block(&mut straight, &next).unwrap());
            assert_eq!(after, expected, "{name}: path {path:?}");
            assert_eq!(cache.kv_bytes(), straight.kv_bytes(), "{name}: rows held");
            // What an MTP drafter is shipped for the path is the path's own K/V.
            let shipped = model.shared_kv(&cache, start, start + path.len()).unwrap();
            let wanted = model
                .shared_kv(&straight, start, start + path.len())
                .unwrap();
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(flat(&shipped.full.keys), flat(&wanted.full.keys));
            assert_eq!(flat(&shipped.full.values), flat(&wanted.full.values));
        }
        // A path that is not one of the block is refused, and the cache is left alone.
        let mut cache = prefilled(&model, prompt);
        let start = cache.len();
        tree_logits(&model, &mut cache, &block, &parents, &[block.len()]);
        let held = cache.len();
        assert!(model.keep_path(&mut cache, start, &[1, 2]).is_err());
        assert!(model.keep_path(&mut cache, start, &[0, 2, 1]).is_err());
        assert_eq!(cache.len(), held);
    }
}

#[test]
fn a_tree_row_beside_chains_is_the_tree_alone() {
    let name = "target-moe";
    let model = load(name);
    let vocab = model.config().vocab_size;
    let ps = prompts(name);
    let tree = tokens(31, 7, vocab);
    let parents = vec![0, 0, 1, 2, 2, 3];
    let chain = tokens(32, 4, vocab);

    let mut alone = prefilled(&model, &ps[0]);
    let tree_alone = tree_logits(&model, &mut alone, &tree, &parents, &[tree.len()]);
    let mut chain_cache = prefilled(&model, &ps[1]);
    let chain_alone = rows(&model.forward_block(&mut chain_cache, &chain).unwrap());

    let (mut a, mut b) = (prefilled(&model, &ps[0]), prefilled(&model, &ps[1]));
    let mut block = [
        BlockInput::chain(&mut b, &chain),
        BlockInput {
            cache: &mut a,
            tokens: &tree,
            parents: &parents,
        },
    ];
    let hidden = model.forward(&mut block, OutputRows::All).unwrap();
    assert_eq!(rows(&hidden[0]), chain_alone);
    assert_eq!(rows(&model.logits(&hidden[1]).unwrap()), tree_alone);
}

#[test]
fn a_malformed_tree_is_refused_naming_the_parents() {
    let model = load("target-full");
    let block = [1u32, 2, 3];
    for parents in [vec![0u32, 2], vec![0], vec![0, 1, 2, 3, 4, 5]] {
        let mut cache = prefilled(&model, &[4, 5]);
        let mut rows = [BlockInput {
            cache: &mut cache,
            tokens: &block,
            parents: &parents,
        }];
        let err = model
            .forward(&mut rows, OutputRows::All)
            .unwrap_err()
            .to_string();
        assert!(err.contains("parents"), "{parents:?}: {err}");
        assert_eq!(cache.len(), 2, "a refused block leaves the cache alone");
    }
    // A tree gives every node's hidden state, not the last one only.
    let mut cache = prefilled(&model, &[4, 5]);
    let mut rows = [BlockInput {
        cache: &mut cache,
        tokens: &block,
        parents: &[0, 0],
    }];
    let err = model
        .forward(&mut rows, OutputRows::Last)
        .unwrap_err()
        .to_string();
    assert!(err.contains("parents"), "{err}");
}
