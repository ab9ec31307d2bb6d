//! Token trees from a real draft model (a tiny random Qwen2 GGUF): whichever path of its
//! tree the target commits, a session that drafts trees proposes next what a session that
//! drafts chains would, and its tree always holds that chain.

use candle_core::Device;
use specd_core::{DraftTree, SamplingParams};
use specd_drafter::{
    Branching, DraftCarry, DraftEngine, DraftModelEngine, DraftStep, OpenSession, SessionSource,
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
        let branching = Branching::new(branch_nodes, None);
        let tree = trees.draft_tree(&mut b, step, branching).unwrap();
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

mod over_grpc {
    use std::sync::Arc;

    use specd_core::DraftTree;
    use specd_drafter::DrafterServerConfig;
    use specd_wire::drafter::{draft_request, DraftRequest, DraftResponse, OpenHeader, TokenCarry};
    use specd_wire::Sampling;
    use tonic::Code;

    use super::{engine, first_child_path};
    use crate::qwen2_support::{TempGguf, TinySpec};
    use crate::support::{open_messages, sampling, TestDrafter};

    fn round(session_id: &str, round: u64, position: u32, tree_nodes: u32) -> DraftRequest {
        DraftRequest {
            session_id: session_id.to_owned(),
            round,
            bonus: 9,
            position,
            count: 4,
            output_index_base: 0,
            carry: Some(draft_request::Carry::Tokens(TokenCarry {
                committed: vec![],
            })),
            // Ignored for a tree round.
            predraft: true,
            predraft_branches: 2,
            tree_nodes,
            least_branch_chance: None,
        }
    }

    /// A session opened on `context`, drafting greedily.
    async fn open(server: &TestDrafter, context: &[u32]) -> String {
        let header = OpenHeader {
            sampling: Some(Sampling {
                temperature: 0.0,
                ..sampling().unwrap()
            }),
            committed_len: context.len() as u32,
            context_ids: context.to_vec(),
            cache_scope: String::new(),
        };
        let mut client = server.client().await;
        client
            .open(tokio_stream::iter(open_messages(header, None)))
            .await
            .unwrap()
            .into_inner()
            .session_id
    }

    async fn draft(
        server: &TestDrafter,
        request: DraftRequest,
    ) -> Result<DraftResponse, tonic::Status> {
        let mut client = server.client().await;
        Ok(client.draft(request).await?.into_inner())
    }

    /// A draft-model drafter service answers `tree_nodes` with a tree (drafts and parents)
    /// that holds the chain it drafts without, repeats it for a retry, branches only where
    /// a branch is as likely as `least_branch_chance` asks, and names the field when the
    /// request asks for more branches than it drafts or a chance that is not one.
    #[tokio::test]
    async fn a_draft_model_service_drafts_trees_on_request() {
        let file = TempGguf::tiny("tree-draft-grpc", &TinySpec::default());
        let server =
            TestDrafter::start_engine(Arc::new(engine(&file)), DrafterServerConfig::default())
                .await;
        let context = [1u32, 2, 3, 4, 5, 6];
        let position = context.len() as u32 - 1;
        let (chains, trees) = (open(&server, &context).await, open(&server, &context).await);
        let chain = draft(&server, round(&chains, 1, position, 0))
            .await
            .unwrap();
        assert!(chain.parents.is_empty());
        let tree = draft(&server, round(&trees, 1, position, 5)).await.unwrap();
        assert!(!tree.predraft_hit);
        let tree = DraftTree {
            tokens: tree.drafts,
            parents: tree.parents,
        };
        tree.check().unwrap();
        assert!(tree.depth() <= 4 && tree.tokens.len() <= 4 + 5, "{tree:?}");
        assert!(
            tree.tokens.len() > chain.drafts.len(),
            "no branch: {tree:?}"
        );
        assert_eq!(first_child_path(&tree), chain.drafts, "{tree:?}");

        // A retry repeats the tree; the same round with another budget is a conflict.
        let again = draft(&server, round(&trees, 1, position, 5)).await.unwrap();
        assert_eq!(
            (&again.drafts, &again.parents),
            (&tree.tokens, &tree.parents)
        );
        let err = draft(&server, round(&trees, 1, position, 2))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
        assert!(err.message().contains("tree_nodes"), "{err}");

        let err = draft(&server, round(&trees, 2, position, 100))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(err.message().contains("tree_nodes"), "{err}");

        // Rows priced: free ones fill the budget, a row worth a sure token takes none.
        let priced = |session: &str, chance: f32| DraftRequest {
            least_branch_chance: Some(chance),
            ..round(session, 1, position, 5)
        };
        let (free, dear) = (open(&server, &context).await, open(&server, &context).await);
        let wide = draft(&server, priced(&free, 0.0)).await.unwrap();
        assert_eq!(wide.drafts.len(), 4 + 5, "{wide:?}");
        let narrow = draft(&server, priced(&dear, 1.0)).await.unwrap();
        assert_eq!(narrow.drafts, chain.drafts, "a branch was taken at price 1");
        for bad in [-0.5, 1.5, f32::NAN] {
            let other = open(&server, &context).await;
            let err = draft(&server, priced(&other, bad)).await.unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{err}");
            assert!(err.message().contains("least_branch_chance"), "{err}");
        }
    }
}
