//! The MTP engine behind the service drafts exactly what the Gemma 4 assistant drafts when
//! handed the target's state directly: the snapshot, hidden and deltas survive the wire.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use specd_drafter::{serve, Branching, DrafterServerConfig, DrafterService, MtpEngine};
use specd_models::gemma4::{Gemma4Model, LayerKv, DEFAULT_PREFILL_CHUNK};
use specd_models::gemma4_assistant::Gemma4Assistant;
use specd_wire::drafter::{draft_request, DraftRequest, DrafterClient, MtpCarry, OpenHeader};
use specd_wire::kv::{KvDeltaTensors, KvPair, KvSnapshot};
use specd_wire::tensor::encode;
use tokio::sync::oneshot;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Channel;

use crate::support::*;

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../crates/models/tests/fixtures/gemma4")
        .join(name)
}

fn wire_pair(layer: &LayerKv) -> KvPair {
    KvPair {
        k: layer.keys.unsqueeze(0).unwrap(),
        v: layer.values.unsqueeze(0).unwrap(),
    }
}

fn wire_hidden(hidden: &Tensor) -> specd_wire::WireTensor {
    encode(&hidden.reshape((1, 1, 64)).unwrap(), "hidden").unwrap()
}

async fn start_mtp_drafter() -> (DrafterClient<Channel>, oneshot::Sender<()>) {
    let engine = MtpEngine::load(
        &fixture("assistant-dense"),
        &fixture("target-full"),
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let service = DrafterService::new(Arc::new(engine), DrafterServerConfig::default()).unwrap();
    let incoming = TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = incoming.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        serve(service, incoming, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (DrafterClient::new(channel), stop)
}

fn draft_request(
    session_id: &str,
    round: u64,
    bonus: u32,
    position: usize,
    hidden: &Tensor,
    delta: Option<specd_wire::KvDelta>,
) -> DraftRequest {
    DraftRequest {
        session_id: session_id.to_owned(),
        round,
        bonus,
        position: position as u32,
        count: 4,
        output_index_base: 1,
        carry: Some(draft_request::Carry::Mtp(MtpCarry {
            hidden: Some(wire_hidden(hidden)),
            delta,
            later_deltas: Vec::new(),
        })),
        predraft: false,
        predraft_branches: 0,
        tree_nodes: 0,
        least_branch_chance: None,
    }
}

#[tokio::test]
async fn served_drafts_equal_direct_assistant_drafts() {
    let device = Device::Cpu;
    let target = Gemma4Model::load(&fixture("target-full"), DType::F32, &device).unwrap();
    let assistant = Gemma4Assistant::load(
        &fixture("assistant-dense"),
        &fixture("target-full"),
        DType::F32,
        &device,
    )
    .unwrap();
    let (mut client, _stop) = start_mtp_drafter().await;

    // Prefill a prompt long enough for the sliding window to have moved.
    let prompt: Vec<u32> = (0..30).map(|i| (i * 13 % 250) as u32 + 2).collect();
    let mut cache = target.new_cache(16);
    let hidden = target
        .prefill(&mut cache, &prompt, DEFAULT_PREFILL_CHUNK)
        .unwrap();
    let len = cache.len();
    let shared = target.shared_kv(&cache, 0, len).unwrap();
    let sliding = shared.sliding.as_ref().unwrap();
    let snapshot = KvSnapshot {
        committed_len: len as u32,
        sliding_start: sliding.start as u32,
        full: wire_pair(&shared.full),
        sliding: Some(wire_pair(sliding)),
    };
    let header = OpenHeader {
        sampling: None,
        committed_len: len as u32,
        context_ids: Vec::new(),
        cache_scope: String::new(),
    };
    let session = client
        .open(tokio_stream::iter(open_messages(header, Some(&snapshot))))
        .await
        .unwrap()
        .into_inner()
        .session_id;

    let bonus = 17;
    let mut mirror = assistant.new_mirror(&shared).unwrap();
    let direct = assistant.draft_greedy(&mirror, bonus, &hidden, 4).unwrap();
    let served = draft(
        &mut client,
        draft_request(&session, 1, bonus, len - 1, &hidden, None),
    )
    .await
    .unwrap();
    assert_eq!(served, direct);

    // One verify-like step commits the bonus; both sides take the new row.
    let block_hidden = target.forward_block(&mut cache, &[bonus]).unwrap();
    let rows = target.shared_kv(&cache, len, len + 1).unwrap();
    mirror.apply_delta(&rows).unwrap();
    let next_hidden = block_hidden.narrow(0, 0, 1).unwrap();
    let next_bonus = 33;
    let direct = assistant
        .draft_greedy(&mirror, next_bonus, &next_hidden, 4)
        .unwrap();
    let delta = KvDeltaTensors {
        start_position: len as u32,
        full: wire_pair(&rows.full),
        sliding: rows.sliding.as_ref().map(wire_pair),
        sliding_evicted: 0,
    }
    .encode("delta")
    .unwrap();
    let served = draft(
        &mut client,
        draft_request(&session, 2, next_bonus, len, &next_hidden, Some(delta)),
    )
    .await
    .unwrap();
    assert_eq!(served, direct);
}

/// The root-first node slots of the tree from its root to draft `j` (0-based).
fn path_to(tree: &specd_core::DraftTree, j: usize) -> Vec<usize> {
    let mut path = vec![j];
    while tree.parent(path[path.len() - 1]) > 0 {
        path.push(tree.parent(path[path.len() - 1]) - 1);
    }
    path.reverse();
    path
}

#[test]
fn an_mtp_tree_holds_the_chain_and_each_node_is_a_choice_after_its_path() {
    use specd_core::{sample, SamplingParams};
    use specd_drafter::{DraftCarry, DraftEngine, DraftStep, OpenSession, SessionSource};

    let device = Device::Cpu;
    let target = Gemma4Model::load(&fixture("target-full"), DType::F32, &device).unwrap();
    let seeded = |seed| SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 40,
        seed,
    };
    for name in ["assistant-dense", "assistant-centroid"] {
        let engine =
            MtpEngine::load(&fixture(name), &fixture("target-full"), DType::F32, &device).unwrap();
        let assistant =
            Gemma4Assistant::load(&fixture(name), &fixture("target-full"), DType::F32, &device)
                .unwrap();
        let prompt: Vec<u32> = (0..30).map(|i| (i * 13 % 250) as u32 + 2).collect();
        let mut cache = target.new_cache(16);
        let hidden = target
            .prefill(&mut cache, &prompt, DEFAULT_PREFILL_CHUNK)
            .unwrap();
        let shared = target.shared_kv(&cache, 0, cache.len()).unwrap();
        for sampling in [SamplingParams::GREEDY, seeded(7), seeded(8)] {
            let mut session = engine
                .open(OpenSession {
                    sampling,
                    committed_len: cache.len(),
                    source: SessionSource::Snapshot(shared.clone()),
                    cache_scope: Default::default(),
                })
                .unwrap();
            engine
                .apply(
                    &mut session,
                    DraftCarry::Mtp {
                        hidden: hidden.clone(),
                        delta: None,
                    },
                )
                .unwrap();
            let step = DraftStep {
                bonus: 17,
                position: cache.len() - 1,
                count: 4,
                output_index_base: 1,
                branches: 0,
            };
            let chain = engine.draft(&mut session, step).unwrap();
            let tree = engine
                .draft_tree(&mut session, step, Branching::new(4, None))
                .unwrap();
            let case = format!("{name}, {sampling:?}");
            assert!(tree.check().is_ok(), "{case}: {tree:?}");
            assert!(!tree.is_chain(), "{case}: nearly flat logits branch");
            assert!(tree.tokens.len() <= 8 && tree.depth() <= 4);

            // The first child of every node, from the root, is the chain.
            let mut first_children = Vec::new();
            let mut at = 0;
            while let Some(j) = (0..tree.tokens.len()).find(|&j| tree.parent(j) == at) {
                first_children.push(tree.tokens[j]);
                at = j + 1;
            }
            assert_eq!(first_children, chain, "{case}");
            // Each draft is the assistant's first or second choice after the steps of its
            // path: greedy, its best two; sampled, the draw with the target's key at the
            // draft's output index and the likeliest other token.
            let mirror = assistant.new_mirror(&shared).unwrap();
            for j in 0..tree.tokens.len() {
                let path = path_to(&tree, j);
                let (mut token, mut state) = (17, hidden.clone());
                for &at in &path[..path.len() - 1] {
                    let out = assistant.step(&mirror, token, &state).unwrap();
                    (token, state) = (tree.tokens[at], out.hidden);
                }
                let out = assistant.step(&mirror, token, &state).unwrap();
                let (first, second) = if sampling.is_greedy() {
                    let ranked = assistant.top_two(&out.normed).unwrap();
                    assert_eq!(ranked.best.0, assistant.argmax(&out.normed).unwrap());
                    (ranked.best.0, ranked.runner_up.map(|r| r.0))
                } else {
                    let logits = assistant.logits(&out.normed).unwrap();
                    let index = step.output_index_base + path.len() as u64 - 1;
                    let draw = sample(&logits, &sampling, index).unwrap();
                    let other = (0..logits.len())
                        .filter(|&t| t != draw as usize && logits[t].is_finite())
                        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)));
                    (draw, other.map(|t| t as u32))
                };
                let choice = tree.tokens[j];
                assert!(
                    choice == first || Some(choice) == second,
                    "{case}: draft {j} ({choice}) is neither {first} nor {second:?}"
                );
            }
        }
    }
}
