//! Overlapped drafting end to end: a draft-model drafter service (a tiny random Qwen2 GGUF
//! sharing the fixture's 256-token vocabulary) pre-drafts while the verifier verifies. The
//! output is the same with overlap on and off, with and without rejection branches, and
//! the stats count the pre-drafts. In `auto`, a drafter on the verifier's cores starts
//! without pre-drafting and the router probes pre-drafting after a few rounds.

use candle_core::Device;
use specd_drafter::DraftModelEngine;
use specd_models::qwen2::Qwen2Model;
use specd_router::overlap::{OverlapMode, PROBE_ROUNDS, REPROBE_AFTER};
use specd_router::{DraftSource, RouterConfig};
use specd_wire::generation::GenerationClient;

use crate::qwen2_support::{TempGguf, TinySpec};
use crate::support::*;

#[tokio::test]
async fn overlap_changes_the_stats_and_nothing_else() {
    let file = TempGguf::tiny("router-overlap", &TinySpec::default());
    let model = Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
    let drafter = start_drafter(DraftModelEngine::new(model, "tiny".into(), 8)).await;
    let verifier = start_verifier(64).await;
    let target = fixture("target-full");
    let router = |overlap, predraft_branches| {
        let config = RouterConfig {
            overlap,
            predraft_branches,
            ..RouterConfig::default()
        };
        let source = DraftSource::Remote(vec![drafter.url()]);
        start_router_with(&verifier, source, &target, config)
    };
    let (on, branched, off) = (
        router(OverlapMode::On, 0).await,
        router(OverlapMode::On, 8).await,
        router(OverlapMode::Off, 8).await,
    );
    let mut on = GenerationClient::new(on.channel().await);
    let mut branched = GenerationClient::new(branched.channel().await);
    let mut off = GenerationClient::new(off.channel().await);
    for (temperature, seed) in [(0.0, 0), (0.9, 3)] {
        let request = |block| {
            sampled(
                with_block(ids_request(&PROMPT, 48), block, block.is_none()),
                temperature,
                seed,
            )
        };
        let plain = generate(&mut on, request(None)).await.unwrap();
        let overlapped = generate(&mut on, request(Some(4))).await.unwrap();
        let with_branches = generate(&mut branched, request(Some(4))).await.unwrap();
        let sequential = generate(&mut off, request(Some(4))).await.unwrap();
        assert_eq!(overlapped.token_ids, plain.token_ids, "t {temperature}");
        assert_eq!(with_branches.token_ids, plain.token_ids, "t {temperature}");
        assert_eq!(sequential.token_ids, plain.token_ids, "t {temperature}");
        let (with, without) = (overlapped.stats.unwrap(), sequential.stats.unwrap());
        let branching = with_branches.stats.unwrap();
        // The same drafts either way, so the same rounds and acceptance.
        for stats in [&with, &branching] {
            assert_eq!(stats.rounds, without.rounds);
            assert_eq!(stats.accepted, without.accepted);
            // Every drafting round after the first asked for the previous round's pre-draft.
            assert!(stats.predraft_hits + stats.predraft_misses > 0, "{stats:?}");
        }
        assert!(with.drafted > 0);
        assert_eq!(with.predraft_branch_hits, 0);
        // Branch hits are counted among the hits. (How many rounds hit depends on how far
        // each pre-draft got before the next Draft, which is timing.)
        assert!(
            branching.predraft_branch_hits <= branching.predraft_hits,
            "{branching:?}"
        );
        assert_eq!(without.predraft_hits + without.predraft_misses, 0);
    }
}

#[tokio::test]
async fn auto_overlap_starts_off_beside_the_verifier_and_probes_pre_drafting() {
    let file = TempGguf::tiny("router-overlap-auto", &TinySpec::default());
    let model = Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
    let drafter = start_drafter(DraftModelEngine::new(model, "tiny".into(), 8)).await;
    let verifier = start_verifier(64).await;
    let target = fixture("target-full");
    let config = RouterConfig {
        overlap: OverlapMode::Auto,
        ..RouterConfig::default()
    };
    let source = DraftSource::Remote(vec![drafter.url()]);
    let router = start_router_with(&verifier, source, &target, config).await;
    let mut client = GenerationClient::new(router.channel().await);
    // One draft a round, at most two tokens: enough rounds for the first probe.
    let max_tokens = 2 * (REPROBE_AFTER + PROBE_ROUNDS + 8);
    let request = |block| with_block(ids_request(&PROMPT, max_tokens), block, block.is_none());
    let plain = generate(&mut client, request(None)).await.unwrap();
    let auto = generate(&mut client, request(Some(2))).await.unwrap();
    assert_eq!(auto.token_ids, plain.token_ids);
    let stats = auto.stats.unwrap();
    let rounds = stats.rounds - stats.plain_rounds;
    assert!(rounds > REPROBE_AFTER + PROBE_ROUNDS, "{stats:?}");
    // The drafter runs on this machine's cores, as the verifier does: the first call and
    // the next REPROBE_AFTER (whose rounds are measured) ask for no pre-draft; the probe
    // that follows does, and switches the request's pre-drafting on.
    let asked = stats.predraft_hits + stats.predraft_misses;
    assert!(asked > 0, "no probe: {stats:?}");
    assert!(asked < rounds - REPROBE_AFTER, "{stats:?}");
    assert!(stats.overlap_switches >= 1, "{stats:?}");
}
