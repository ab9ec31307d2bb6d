//! Token trees across the split services: a router whose verifier (a tiny random Qwen2 on the
//! CPU engine) says in its Stats that it verifies trees asks a draft-model drafter service
//! for trees. The output is the target's own, greedy and seeded, and the stats count the
//! tree rounds; with `tree_nodes` 0 every round is a chain.

use std::sync::Arc;

use candle_core::Device;
use specd_drafter::DraftModelEngine;
use specd_models::qwen2::Qwen2Model;
use specd_router::overlap::OverlapMode;
use specd_router::{DraftSource, RouterConfig};
use specd_verifier::server::{VerifierServerConfig, VerifierService};
use specd_verifier::{LocalVerifier, Qwen2Target, VerifierLimits};
use specd_wire::generation::GenerationClient;

use crate::qwen2_support::{TempGguf, TinySpec};
use crate::support::*;

#[tokio::test]
async fn split_services_verify_drafted_trees_losslessly() {
    // The model drafts for itself: greedy rounds accept every draft, sampled ones some.
    let file = TempGguf::tiny("router-trees", &TinySpec::default());
    let load = || Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
    let drafter = start_drafter(DraftModelEngine::new(load(), "tiny".into(), 8)).await;
    let target = Arc::new(Qwen2Target::new(load(), Vec::new()));
    let local = LocalVerifier::new(target, VerifierLimits { max_sequences: 16 });
    let verifier = serve_verifier(VerifierService::new(
        Arc::new(local),
        VerifierServerConfig::default(),
    ))
    .await;
    let text = fixture("target-full");
    let router = |tree_nodes, overlap| {
        let config = RouterConfig {
            tree_nodes,
            overlap,
            ..RouterConfig::default()
        };
        let source = DraftSource::Remote(vec![drafter.url()]);
        start_router_with(&verifier, source, &text, config)
    };
    let (trees, chains, overlapped) = (
        router(3, OverlapMode::Off).await,
        router(0, OverlapMode::Off).await,
        // Overlap on: chain rounds pre-draft, tree rounds do not.
        router(3, OverlapMode::On).await,
    );
    let mut trees = GenerationClient::new(trees.channel().await);
    let mut chains = GenerationClient::new(chains.channel().await);
    let mut overlapped = GenerationClient::new(overlapped.channel().await);
    let mut with_trees = 0;
    for (temperature, seed) in [(0.0, 0), (0.9, 5), (0.9, 6)] {
        let request = |block| {
            sampled(
                with_block(ids_request(&PROMPT, 96), block, block.is_none()),
                temperature,
                seed,
            )
        };
        let plain = generate(&mut chains, request(None)).await.unwrap();
        let tree = generate(&mut trees, request(Some(4))).await.unwrap();
        let chain = generate(&mut chains, request(Some(4))).await.unwrap();
        let beside = generate(&mut overlapped, request(Some(4))).await.unwrap();
        assert_eq!(
            beside.token_ids, plain.token_ids,
            "overlapped, t {temperature} seed {seed}"
        );
        // Tree rounds between chains are not overlap switches: with overlap forced on there
        // are none.
        let beside = beside.stats.unwrap();
        assert_eq!(beside.overlap_switches, 0, "{beside:?}");
        assert_eq!(
            tree.token_ids, plain.token_ids,
            "t {temperature} seed {seed}"
        );
        assert_eq!(
            chain.token_ids, plain.token_ids,
            "t {temperature} seed {seed}"
        );
        let (tree, chain) = (tree.stats.unwrap(), chain.stats.unwrap());
        // A request tries trees in its first drafting rounds (a tiny model may finish
        // before its drafter session has opened: then every round is plain).
        if tree.rounds - tree.plain_rounds >= 4 {
            assert!(tree.tree_rounds > 0, "{tree:?}");
            assert!(tree.tree_branch_drafts > 0, "{tree:?}");
        }
        with_trees += usize::from(tree.tree_rounds > 0);
        assert_eq!(
            (chain.tree_rounds, chain.tree_branch_drafts),
            (0, 0),
            "{chain:?}"
        );
    }
    assert!(with_trees > 0, "no request verified a tree");
}
