//! Token trees over the Verifier gRPC service, on a tiny random Qwen2 target (the CPU
//! engine) and the tiny Gemma 4 target: whatever tree a round sends, the tokens it emits are
//! the target's own, greedy and seeded, and the sequence continues as if only the accepted
//! path had run. Malformed trees, and trees for a target that verifies chains only, are
//! refused naming `parents`.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use specd_models::gemma4::{Gemma4Model, SequenceCache};
use specd_models::qwen2::Qwen2Model;
use specd_models::{CausalLm, OutputRows, SeqBlock};
use specd_verifier::server::VerifierServerConfig;
use specd_verifier::{LmTarget, LocalVerifier, Qwen2Target, VerifierLimits};
use specd_wire::verifier::{VerifierClient, VerifierStatsRequest};
use specd_wire::Sampling;
use tonic::transport::Channel;
use tonic::Code;

use crate::qwen2_support::{Rng, TempGguf, TinySpec};
use crate::support::{fixture, prefill, prefill_request, verify, verify_request, TestVerifier};

/// A verifier server on a tiny Qwen2 target.
async fn qwen2_server(file: &TempGguf) -> (VerifierClient<Channel>, TestVerifier<Qwen2Target>) {
    let model = Qwen2Model::load(file.path(), &Device::Cpu).unwrap();
    let target = Arc::new(Qwen2Target::new(model, Vec::new()));
    let local = LocalVerifier::new(target, VerifierLimits::default());
    let server = TestVerifier::serving(local, VerifierServerConfig::default()).await;
    (server.client().await, server)
}

/// What the verifier's Stats say of trees.
async fn verifies_trees(client: &mut VerifierClient<Channel>) -> bool {
    let stats = client.stats(VerifierStatsRequest {}).await.unwrap();
    stats.into_inner().verifies_trees
}

fn sampling(seeded: bool) -> Option<Sampling> {
    Some(Sampling {
        temperature: if seeded { 0.9 } else { 0.0 },
        top_p: 1.0,
        top_k: 0,
        seed: 5,
    })
}

/// `count` tokens decoded one per round (the reference), after the first token.
async fn plain_tokens(
    client: &mut VerifierClient<Channel>,
    prompt: &[u32],
    seeded: bool,
    count: usize,
) -> Vec<u32> {
    let mut request = prefill_request(prompt, false);
    request.sampling = sampling(seeded);
    let head = prefill(client, request).await.unwrap().head;
    let mut tokens = vec![head.first_token];
    for round in 1..=count as u64 {
        let committed = (prompt.len() + tokens.len() - 1) as u32;
        let bonus = tokens[tokens.len() - 1];
        let request = verify_request(
            &head.seq_id,
            round,
            &[bonus],
            tokens.len() as u32 - 1,
            committed,
        );
        let answer = verify(client, request).await.unwrap();
        tokens.extend(answer.new_tokens);
    }
    tokens
}

/// A random tree after the bonus that holds the reference's next tokens on one branch
/// (for `along` levels) among random nodes.
fn tree_around(reference: &[u32], along: usize, rng: &mut Rng) -> (Vec<u32>, Vec<u32>) {
    let (mut tokens, mut parents) = (Vec::new(), Vec::new());
    let mut on_path = 0u32;
    for (depth, &token) in reference.iter().take(along).enumerate() {
        // A random sibling first, then the reference's token, then a random child of it.
        let sibling = (token + 1 + (rng.next_u64() % 50) as u32) % 256;
        tokens.push(sibling);
        parents.push(on_path);
        tokens.push(token);
        parents.push(on_path);
        on_path = tokens.len() as u32;
        if depth % 2 == 1 {
            tokens.push((token + 7) % 256);
            parents.push(tokens.len() as u32 - 2);
        }
    }
    (tokens, parents)
}

#[tokio::test]
async fn trees_emit_the_targets_own_tokens_greedy_and_seeded() {
    let spec = TinySpec::default();
    let file = TempGguf::tiny("verifier-trees", &spec);
    let (mut client, _server) = qwen2_server(&file).await;
    let prompt = Rng::new(4).tokens(9, spec.vocab);
    trees_emit_the_plain_tokens(&mut client, &prompt).await;
}

#[tokio::test]
async fn gemma4_trees_emit_the_targets_own_tokens_greedy_and_seeded() {
    // Sliding window 8: paths outgrow it, and the prompt wraps it.
    let server = TestVerifier::start().await;
    let mut client = server.client().await;
    let prompt = Rng::new(5).tokens(21, 256);
    trees_emit_the_plain_tokens(&mut client, &prompt).await;
}

/// Rounds of random trees around the plain tokens: each answer is the plain tokens, its
/// retry replays it, and the same tokens as a chain are not a retry.
async fn trees_emit_the_plain_tokens(client: &mut VerifierClient<Channel>, prompt: &[u32]) {
    assert!(verifies_trees(client).await);
    for seeded in [false, true] {
        let reference = plain_tokens(client, prompt, seeded, 40).await;
        let mut request = prefill_request(prompt, false);
        request.sampling = sampling(seeded);
        let head = prefill(client, request).await.unwrap().head;
        assert_eq!(head.first_token, reference[0]);
        let mut emitted = vec![head.first_token];
        let mut rng = Rng::new(9);
        let mut round = 0;
        while emitted.len() < 30 {
            round += 1;
            let along = (rng.next_u64() % 4) as usize;
            let next = &reference[emitted.len()..];
            let (drafts, parents) = tree_around(next, along.min(next.len()), &mut rng);
            let mut tokens = vec![emitted[emitted.len() - 1]];
            tokens.extend(&drafts);
            let committed = (prompt.len() + emitted.len() - 1) as u32;
            let mut request = verify_request(
                &head.seq_id,
                round,
                &tokens,
                emitted.len() as u32 - 1,
                committed,
            );
            request.parents = parents.clone();
            let answer = verify(client, request.clone()).await.unwrap();
            let expected = &reference[emitted.len()..emitted.len() + answer.new_tokens.len()];
            assert_eq!(answer.new_tokens, expected, "seeded {seeded} round {round}");
            assert!(
                answer.accepted as usize >= along.min(next.len()),
                "round {round}"
            );
            assert_eq!(answer.committed_len, committed + answer.accepted + 1);
            // A retry replays the answer; the same tokens as a chain are not a retry.
            let replay = verify(client, request.clone()).await.unwrap();
            assert!(replay.replayed && replay.new_tokens == answer.new_tokens);
            if !parents.is_empty() {
                request.parents.clear();
                let err = verify(client, request).await.unwrap_err();
                assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
            }
            emitted.extend(answer.new_tokens);
        }
        assert_eq!(emitted[..], reference[..emitted.len()]);
    }
}

#[tokio::test]
async fn malformed_trees_are_refused_naming_parents() {
    let spec = TinySpec::default();
    let file = TempGguf::tiny("verifier-bad-trees", &spec);
    let (mut client, _server) = qwen2_server(&file).await;
    // Routers learn from Stats that this target takes trees.
    assert!(verifies_trees(&mut client).await);
    let prompt = [3u32, 4, 5];
    let head = prefill(&mut client, prefill_request(&prompt, false))
        .await
        .unwrap()
        .head;
    let bonus = head.first_token;
    for parents in [vec![0u32], vec![0, 2], vec![0, 0], vec![0, 1, 1, 9]] {
        let mut request = verify_request(&head.seq_id, 1, &[bonus, 7, 7], 0, 3);
        request.parents = parents.clone();
        let err = verify(&mut client, request).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{parents:?}: {err}");
        assert!(err.message().contains("parents"), "{parents:?}: {err}");
    }
    // Nothing was applied: round 1 still runs.
    let request = verify_request(&head.seq_id, 1, &[bonus, 7, 8], 0, 3);
    verify(&mut client, request).await.unwrap();
}

/// A family that keeps the trait's default, chains only: Gemma 4 with its trees hidden.
struct ChainsOnly(Gemma4Model);

impl CausalLm for ChainsOnly {
    type Cache = SequenceCache;

    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }
    fn max_context(&self) -> usize {
        CausalLm::max_context(&self.0)
    }
    fn device(&self) -> &Device {
        CausalLm::device(&self.0)
    }
    fn default_prefill_chunk(&self) -> usize {
        self.0.default_prefill_chunk()
    }
    fn new_cache(&self, max_rollback: usize) -> specd_models::Result<SequenceCache> {
        CausalLm::new_cache(&self.0, max_rollback)
    }
    fn cache_len(&self, cache: &SequenceCache) -> usize {
        self.0.cache_len(cache)
    }
    fn cache_bytes(&self, cache: &SequenceCache) -> usize {
        self.0.cache_bytes(cache)
    }
    fn kv_bytes_bound(&self, tokens: usize, chunk: usize, max_rollback: usize) -> usize {
        self.0.kv_bytes_bound(tokens, chunk, max_rollback)
    }
    fn forward(
        &self,
        rows: &mut [SeqBlock<'_, SequenceCache>],
        output: OutputRows,
    ) -> specd_models::Result<Vec<Tensor>> {
        CausalLm::forward(&self.0, rows, output)
    }
    fn logits(&self, hidden: &Tensor) -> specd_models::Result<Tensor> {
        CausalLm::logits(&self.0, hidden)
    }
    fn truncate(&self, cache: &mut SequenceCache, len: usize) -> specd_models::Result<()> {
        CausalLm::truncate(&self.0, cache, len)
    }
}

#[tokio::test]
async fn a_target_that_verifies_chains_only_refuses_trees() {
    let model = Gemma4Model::load(&fixture("target-full"), DType::F32, &Device::Cpu).unwrap();
    let target = Arc::new(LmTarget::new(ChainsOnly(model), Vec::new()));
    let local = LocalVerifier::new(target, VerifierLimits::default());
    let server = TestVerifier::serving(local, VerifierServerConfig::default()).await;
    let mut client = server.client().await;
    assert!(!verifies_trees(&mut client).await);
    let head = prefill(&mut client, prefill_request(&[2, 3, 4], false))
        .await
        .unwrap()
        .head;
    let mut request = verify_request(&head.seq_id, 1, &[head.first_token, 5, 6], 0, 3);
    request.parents = vec![0, 0];
    let err = verify(&mut client, request).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("parents"), "{err}");
}
