//! Batched verification: concurrent requests share forwards, long prompts prefill in pieces
//! between them, a K/V budget bounds admission, and a cancelled round leaves no trace. Every
//! row's answers must equal the same request run alone on a [`LocalVerifier`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use specd_core::{
    PrefillRequest as CorePrefill, SamplingParams, SeqId, VerifyRequest as CoreVerify,
};
use specd_verifier::{BatchConfig, Gemma4Target, KvBudget, LocalVerifier, VerifierLimits};
use specd_wire::sampling::sampling_from_wire;
use specd_wire::verifier::{
    PrefillRequest, ReleaseRequest, TruncateRequest, VerifierClient, VerifierStatsRequest,
};
use specd_wire::Sampling;
use tonic::transport::Channel;
use tonic::Code;

use crate::support::*;

/// One request of a test: its prompt, how it drafts and when it stops.
#[derive(Clone, Debug)]
struct Spec {
    prompt: Vec<u32>,
    /// Block size at most (bonus plus drafts).
    block: usize,
    max_tokens: usize,
    sampling: Sampling,
    /// Seeds the draft choices.
    draft_seed: u64,
    /// Truncates the overshoot of the last round before releasing, as the round loop does.
    truncate_at_end: bool,
}

/// What a request saw: the first token, every round's answer, the tokens emitted.
#[derive(Clone, Debug, PartialEq)]
struct Run {
    first_token: u32,
    rounds: Vec<(u32, Vec<u32>)>,
    emitted: Vec<u32>,
}

/// A small deterministic generator (splitmix64) for draft choices.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

pub(crate) fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 3 + (i * 37 + salt * 11) % 250)
        .collect()
}

fn seeded(seed: u64) -> Sampling {
    Sampling {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 40,
        seed,
    }
}

fn greedy_wire() -> Sampling {
    greedy().unwrap()
}

/// Nine requests with different prompt lengths, block sizes, budgets and sampling.
fn mixed_specs() -> Vec<Spec> {
    (0..9)
        .map(|i| Spec {
            prompt: prompt(3 + i * 5, i as u32),
            block: 1 + i % 5,
            max_tokens: 4 + (i * 3) % 11,
            sampling: if i % 2 == 0 {
                greedy_wire()
            } else {
                seeded(100 + i as u64)
            },
            draft_seed: 7 + i as u64,
            truncate_at_end: i % 3 == 0,
        })
        .collect()
}

/// The next block: the bonus, then drafts that follow the request's plain decode with some
/// replaced by other tokens, so rounds accept anything from none to all of them.
fn next_block(spec: &Spec, draws: &mut Draws, reference: &[u32], emitted: &[u32]) -> Vec<u32> {
    let mut block = vec![*emitted.last().unwrap()];
    let drafts = draws.below(spec.block);
    for j in 0..drafts {
        let truth = reference.get(emitted.len() + j).copied().unwrap_or(5);
        let token = if draws.below(3) == 0 {
            (truth + 1 + draws.below(200) as u32) % 256
        } else {
            truth
        };
        block.push(token);
    }
    block
}

fn core_sampling(spec: &Spec) -> SamplingParams {
    sampling_from_wire(Some(&spec.sampling)).unwrap()
}

fn local_verifier(target: Arc<Gemma4Target>) -> LocalVerifier<Gemma4Target> {
    LocalVerifier::new(target, VerifierLimits::default())
}

/// The request's tokens decoded one at a time, alone: what any drafts must reproduce.
fn plain_decode(local: &LocalVerifier<Gemma4Target>, spec: &Spec, seq: u64) -> Vec<u32> {
    let seq = SeqId(seq);
    let prefilled = local
        .prefill_sync(core_prefill(seq, spec.prompt.clone(), core_sampling(spec)))
        .unwrap();
    let mut tokens = vec![prefilled.first_token];
    // A few tokens past the end, so drafts of the last rounds have something to follow.
    for round in 1..(spec.max_tokens + 16) as u32 {
        let verified = local
            .verify_sync(plain_round(seq.0, round, &tokens))
            .unwrap();
        tokens.extend(verified.new_tokens);
    }
    local.release_sync(seq);
    tokens
}

/// The request run alone, in process, with the same blocks the server run sends.
fn solo_run(local: &LocalVerifier<Gemma4Target>, spec: &Spec, reference: &[u32], seq: u64) -> Run {
    let seq = SeqId(seq);
    let first_token = local
        .prefill_sync(core_prefill(seq, spec.prompt.clone(), core_sampling(spec)))
        .unwrap()
        .first_token;
    let mut draws = Draws(spec.draft_seed);
    let mut emitted = vec![first_token];
    let mut rounds = Vec::new();
    let mut round = 1;
    while emitted.len() < spec.max_tokens {
        let tokens = next_block(spec, &mut draws, reference, &emitted);
        let verified = local
            .verify_sync(CoreVerify {
                seq,
                round,
                tokens,
                budget: spec.max_tokens - emitted.len(),
                output_index_base: emitted.len() as u64,
                want_carry: false,
                masks: Vec::new(),
                parents: Vec::new(),
            })
            .unwrap();
        emitted.extend(&verified.new_tokens);
        rounds.push((verified.accepted as u32, verified.new_tokens));
        round += 1;
    }
    local.release_sync(seq);
    Run {
        first_token,
        rounds,
        emitted,
    }
}

/// Plain decode and solo run of each spec, on a verifier of its own.
fn expectations(target: Arc<Gemma4Target>, specs: &[Spec]) -> Vec<(Vec<u32>, Run)> {
    let local = local_verifier(target);
    specs
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let reference = plain_decode(&local, spec, 1000 + i as u64);
            let run = solo_run(&local, spec, &reference, 2000 + i as u64);
            assert_eq!(
                run.emitted,
                reference[..spec.max_tokens],
                "spec {i}: drafts must not change what is emitted"
            );
            (reference, run)
        })
        .collect()
}

async fn connect(addr: SocketAddr) -> VerifierClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    VerifierClient::new(channel)
}

fn wire_prefill(spec: &Spec) -> PrefillRequest {
    PrefillRequest {
        prompt_ids: spec.prompt.clone(),
        sampling: Some(spec.sampling),
        max_new_tokens: spec.max_tokens as u32,
        with_mtp_state: false,
        max_chunk_bytes: 0,
        cache_scope: Default::default(),
        ..Default::default()
    }
}

/// The rounds of a prefilled sequence, driven over gRPC until the request's budget is spent;
/// then the sequence is truncated (for some specs) and released.
async fn server_rounds(
    client: &mut VerifierClient<Channel>,
    spec: &Spec,
    reference: &[u32],
    seq_id: String,
    first_token: u32,
    mut committed: u32,
) -> Run {
    let mut draws = Draws(spec.draft_seed);
    let mut emitted = vec![first_token];
    let mut rounds = Vec::new();
    let mut round = 1u64;
    while emitted.len() < spec.max_tokens {
        let tokens = next_block(spec, &mut draws, reference, &emitted);
        let mut request = verify_request(&seq_id, round, &tokens, emitted.len() as u32, committed);
        request.budget = (spec.max_tokens - emitted.len()) as u32;
        let answer = verify(client, request).await.unwrap();
        committed = answer.committed_len;
        emitted.extend(&answer.new_tokens);
        rounds.push((answer.accepted, answer.new_tokens));
        round += 1;
    }
    if spec.truncate_at_end {
        // The cache keeps the prompt and every emitted token but the last.
        let keep = (spec.prompt.len() + spec.max_tokens - 1) as u32;
        client
            .truncate(TruncateRequest {
                seq_id: seq_id.clone(),
                committed_len: keep.min(committed),
            })
            .await
            .unwrap();
    }
    let released = client
        .release(ReleaseRequest { seq_id })
        .await
        .unwrap()
        .into_inner();
    assert!(released.released);
    Run {
        first_token,
        rounds,
        emitted,
    }
}

async fn server_run(addr: SocketAddr, spec: Spec, reference: Vec<u32>) -> Run {
    let mut client = connect(addr).await;
    let head = prefill(&mut client, wire_prefill(&spec))
        .await
        .unwrap()
        .head;
    server_rounds(
        &mut client,
        &spec,
        &reference,
        head.seq_id,
        head.first_token,
        head.committed_len,
    )
    .await
}

/// A wait long enough that rows of concurrent requests always meet in one forward; a batch
/// still runs at once when every live sequence has a row waiting.
fn generous_batching() -> BatchConfig {
    BatchConfig {
        max_rows: 16,
        max_wait: Duration::from_millis(200),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_share_forwards_and_equal_solo_runs() {
    let specs = mixed_specs();
    let expected = expectations(load_target("target-full"), &specs);
    let server = TestVerifier::start_with(Options {
        batch: generous_batching(),
        ..Options::default()
    })
    .await;
    let runs: Vec<_> = specs
        .iter()
        .zip(&expected)
        .map(|(spec, (reference, _))| {
            tokio::spawn(server_run(server.addr, spec.clone(), reference.clone()))
        })
        .collect();
    for (i, (run, (_, solo))) in runs.into_iter().zip(&expected).enumerate() {
        let run = run.await.unwrap();
        assert_eq!(&run, solo, "spec {i} ({:?})", specs[i]);
    }
    let stats = server.batcher.stats();
    assert!(
        stats.largest_batch_rows > 1,
        "rows of different requests never shared a forward: {stats:?}"
    );
    assert!(stats.rows_run > stats.batches_run, "{stats:?}");
    assert_eq!(stats.queue_depth, 0);
    let mut client = server.client().await;
    assert!(drained(&mut client).await);
    let idle = client
        .stats(VerifierStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(idle.kv_bytes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_prefill_interleaves_with_running_rounds() {
    const CHUNK: usize = 4;
    let short: Vec<Spec> = (0..3)
        .map(|i| Spec {
            prompt: prompt(5 + i, 40 + i as u32),
            block: 3,
            max_tokens: 24,
            sampling: if i == 1 { seeded(9) } else { greedy_wire() },
            draft_seed: 50 + i as u64,
            truncate_at_end: false,
        })
        .collect();
    let long = Spec {
        prompt: prompt(96, 77),
        block: 4,
        max_tokens: 8,
        sampling: seeded(31),
        draft_seed: 99,
        truncate_at_end: true,
    };
    let mut all = short.clone();
    all.push(long.clone());
    let expected = expectations(Arc::new(target_with_chunk(CHUNK)), &all);
    let server = TestVerifier::start_with(Options {
        batch: generous_batching(),
        prefill_chunk: Some(CHUNK),
        ..Options::default()
    })
    .await;

    // The short requests prefill and run their first round before the long prompt arrives.
    let mut running = Vec::new();
    let mut started = Vec::new();
    for (spec, (reference, _)) in short.iter().zip(&expected) {
        let mut client = connect(server.addr).await;
        let head = prefill(&mut client, wire_prefill(spec)).await.unwrap().head;
        started.push((client, spec.clone(), reference.clone(), head));
    }
    for (mut client, spec, reference, head) in started {
        running.push(tokio::spawn(async move {
            server_rounds(
                &mut client,
                &spec,
                &reference,
                head.seq_id,
                head.first_token,
                head.committed_len,
            )
            .await
        }));
    }
    let long_run = tokio::spawn(server_run(server.addr, long.clone(), expected[3].0.clone()));

    for (i, run) in running.into_iter().enumerate() {
        assert_eq!(run.await.unwrap(), expected[i].1, "short request {i}");
    }
    assert_eq!(long_run.await.unwrap(), expected[3].1, "long request");
    let pieces: usize = all.iter().map(|s| s.prompt.len().div_ceil(CHUNK)).sum();
    let stats = server.batcher.stats();
    assert_eq!(stats.prefill_chunks_run as usize, pieces, "{stats:?}");
}

fn budget_request(max_new_tokens: u32) -> PrefillRequest {
    PrefillRequest {
        prompt_ids: PROMPT.to_vec(),
        sampling: greedy(),
        max_new_tokens,
        with_mtp_state: false,
        max_chunk_bytes: 0,
        cache_scope: Default::default(),
        ..Default::default()
    }
}

#[tokio::test]
async fn the_kv_token_budget_refuses_at_once_and_recovers_after_release() {
    // Each sequence reserves 12 prompt + 20 new + 17 rollback slack = 49 tokens.
    let server = TestVerifier::start_with(Options {
        kv_budget: KvBudget {
            max_tokens: Some(100),
            max_bytes: None,
        },
        ..Options::default()
    })
    .await;
    let mut client = server.client().await;
    let first = prefill(&mut client, budget_request(20)).await.unwrap().head;
    prefill(&mut client, budget_request(20)).await.unwrap();
    // Refused by the call itself, before any stream: nothing waits for memory.
    let Err(err) = client.prefill(budget_request(20)).await else {
        panic!("a third sequence is over the budget");
    };
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("max_kv_tokens"), "{err}");
    assert_eq!(live_sequences(&mut client).await, 2);
    // Even the smallest request (12 + 1 + 17 = 30 tokens) does not fit the 2 tokens left.
    let Err(err) = client.prefill(budget_request(1)).await else {
        panic!("the smallest request is over the budget too");
    };
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");

    client
        .release(ReleaseRequest {
            seq_id: first.seq_id.clone(),
        })
        .await
        .unwrap();
    let again = prefill(&mut client, budget_request(20)).await.unwrap().head;
    let answer = verify(
        &mut client,
        verify_request(
            &again.seq_id,
            1,
            &[again.first_token],
            1,
            again.committed_len,
        ),
    )
    .await
    .unwrap();
    assert_eq!(answer.committed_len, again.committed_len + 1);
}

#[tokio::test]
async fn the_kv_byte_budget_names_its_limit_and_is_reported() {
    let server = TestVerifier::start_with(Options {
        kv_budget: KvBudget {
            max_tokens: None,
            max_bytes: Some(4096),
        },
        ..Options::default()
    })
    .await;
    let mut client = server.client().await;
    let stats = client
        .stats(VerifierStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.kv_capacity_bytes, 4096);
    let Err(err) = client.prefill(budget_request(64)).await else {
        panic!("a sequence needs more than 4 KiB of K/V");
    };
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("max_kv_bytes"), "{err}");
    assert_eq!(live_sequences(&mut client).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_verify_is_dropped_and_the_sequence_stays_consistent() {
    let specs: Vec<Spec> = (0..2)
        .map(|i| Spec {
            prompt: prompt(6 + 3 * i, 60 + i as u32),
            block: 4,
            max_tokens: 10,
            sampling: if i == 0 { greedy_wire() } else { seeded(5) },
            draft_seed: 70 + i as u64,
            truncate_at_end: false,
        })
        .collect();
    let expected = expectations(load_target("target-full"), &specs);
    // Rows wait for every live sequence, so the first row stays queued until cancelled.
    let server = TestVerifier::start_with(Options {
        batch: BatchConfig {
            max_rows: 16,
            max_wait: Duration::from_secs(20),
        },
        ..Options::default()
    })
    .await;
    let mut heads = Vec::new();
    for spec in &specs {
        let mut client = connect(server.addr).await;
        heads.push(prefill(&mut client, wire_prefill(spec)).await.unwrap().head);
    }

    let head = heads[0].clone();
    let mut draws = Draws(specs[0].draft_seed);
    let block = next_block(&specs[0], &mut draws, &expected[0].0, &[head.first_token]);
    let mut doomed = connect(server.addr).await;
    let request = verify_request(&head.seq_id, 1, &block, 1, head.committed_len);
    let call = tokio::spawn(async move { doomed.verify(request).await });
    let batcher = server.batcher.clone();
    assert!(
        poll_until(|| batcher.stats().queue_depth == 1).await,
        "the row was never queued"
    );
    call.abort();
    let batcher = server.batcher.clone();
    assert!(
        poll_until(|| batcher.stats().cancelled_rows == 1).await,
        "the cancelled row was not dropped: {:?}",
        server.batcher.stats()
    );
    assert_eq!(server.batcher.stats().batches_run, 0);

    // Both requests now run from round 1, exactly as alone.
    let runs: Vec<_> = specs
        .iter()
        .zip(&expected)
        .zip(heads)
        .map(|((spec, (reference, _)), head)| {
            let (spec, reference, addr) = (spec.clone(), reference.clone(), server.addr);
            tokio::spawn(async move {
                let mut client = connect(addr).await;
                server_rounds(
                    &mut client,
                    &spec,
                    &reference,
                    head.seq_id,
                    head.first_token,
                    head.committed_len,
                )
                .await
            })
        })
        .collect();
    for (i, run) in runs.into_iter().enumerate() {
        assert_eq!(run.await.unwrap(), expected[i].1, "request {i}");
    }
}

/// Polls a condition a bounded number of times; false if it never held.
async fn poll_until(condition: impl Fn() -> bool) -> bool {
    for _ in 0..800 {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

struct NoText;

impl specd_core::Detokenizer for NoText {
    fn decode(&self, _ids: &[u32]) -> Result<String, specd_core::stop::DetokenizeError> {
        Ok(String::new())
    }
}

/// Tokens of one request decoded by the core round loop on `verifier`.
async fn round_loop_tokens<V: specd_core::Verifier>(
    verifier: &V,
    seq: u64,
    prompt: Vec<u32>,
    sampling: SamplingParams,
    max_tokens: usize,
) -> Vec<u32> {
    use specd_core::{
        BlockSizeConfig, Event, GenerationRequest, RequestControl, RoundLoop, SessionId,
        StopConditions,
    };
    let request = GenerationRequest {
        seq: SeqId(seq),
        session: SessionId(seq),
        prompt_ids: prompt,
        sampling,
        stop: StopConditions::max_tokens(max_tokens),
        block_size: BlockSizeConfig::PLAIN,
        cache_scope: Default::default(),
        forced_drafts: 0,
        rules: Default::default(),
        top_logprobs: None,
    };
    let mut events = Vec::new();
    RoundLoop::plain(verifier, &NoText)
        .run(request, &mut events, &RequestControl::new())
        .await
        .unwrap();
    events
        .into_iter()
        .filter_map(|e| match e {
            Event::Tokens(delta) => Some(delta.tokens),
            Event::Finished(_) => None,
        })
        .flatten()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_scheduler_serves_the_round_loop_in_process() {
    let target = load_target("target-full");
    let local = local_verifier(target.clone());
    let batch =
        specd_verifier::BatchVerifier::new(Arc::new(local_verifier(target)), generous_batching());
    let seeded_params = sampling_from_wire(Some(&seeded(3))).unwrap();
    let requests = [
        (1, prompt(4, 1), SamplingParams::GREEDY, 9),
        (2, prompt(17, 2), seeded_params, 6),
        (3, prompt(9, 3), SamplingParams::GREEDY, 12),
    ];
    let mut alone = Vec::new();
    for (seq, prompt, sampling, max) in requests.clone() {
        alone.push(round_loop_tokens(&local, seq, prompt, sampling, max).await);
    }
    let [a, b, c] = requests;
    // All three are live before any verifies, so their first rounds can share a forward
    // however the test threads are scheduled (a request prefilled alone could otherwise run
    // its short decode to the end before the next one is even prefilled).
    let gated = PrefilledTogether {
        inner: &batch,
        all_in: tokio::sync::Barrier::new(3),
    };
    let together = tokio::join!(
        round_loop_tokens(&gated, a.0, a.1, a.2, a.3),
        round_loop_tokens(&gated, b.0, b.1, b.2, b.3),
        round_loop_tokens(&gated, c.0, c.1, c.2, c.3),
    );
    assert_eq!(vec![together.0, together.1, together.2], alone);
    assert!(batch.stats().largest_batch_rows > 1, "{:?}", batch.stats());
    assert_eq!(batch.active_sequences(), 0);
    assert_eq!(batch.local().kv_reserved(), (0, 0));
}

/// A verifier whose prefills return only once every request of a test has prefilled.
struct PrefilledTogether<'a, V> {
    inner: &'a V,
    all_in: tokio::sync::Barrier,
}

impl<V: specd_core::Verifier> specd_core::Verifier for PrefilledTogether<'_, V> {
    type Carry = V::Carry;
    type Error = V::Error;

    async fn prefill(
        &self,
        request: CorePrefill,
    ) -> Result<specd_core::Prefilled<Self::Carry>, Self::Error> {
        let prefilled = self.inner.prefill(request).await;
        self.all_in.wait().await;
        prefilled
    }

    async fn verify(
        &self,
        request: CoreVerify,
    ) -> Result<specd_core::Verified<Self::Carry>, Self::Error> {
        self.inner.verify(request).await
    }

    async fn truncate(&self, seq: SeqId, committed_len: usize) -> Result<(), Self::Error> {
        self.inner.truncate(seq, committed_len).await
    }

    async fn release(&self, seq: SeqId) -> Result<(), Self::Error> {
        self.inner.release(seq).await
    }

    fn release_detached(&self, seq: SeqId) {
        self.inner.release_detached(seq)
    }
}

/// The pieces the scheduler interleaves give the very cache and hidden state of the model's
/// own prefill (which the Hugging Face reference tests of specd-models check).
#[test]
fn piecewise_prefill_equals_the_model_prefill() {
    use specd_verifier::{TargetModel, MAX_ROLLBACK};
    let ids = prompt(37, 5);
    for chunk in [1, 4, 16, 512] {
        let target = target_with_chunk(chunk);
        let mut pieces = target.new_cache().unwrap();
        let by_pieces = TargetModel::prefill(&target, &mut pieces, &ids).unwrap();
        let mut whole = target.model().new_cache(MAX_ROLLBACK);
        let by_model = target.model().prefill(&mut whole, &ids, chunk).unwrap();
        assert_eq!(
            by_pieces.to_vec2::<f32>().unwrap(),
            by_model.to_vec2::<f32>().unwrap(),
            "chunk {chunk}"
        );
        let kv_pieces = target.shared_kv(&pieces, 0, ids.len()).unwrap().unwrap();
        let kv_model = target.shared_kv(&whole, 0, ids.len()).unwrap().unwrap();
        assert_eq!(
            kv_pieces
                .full
                .keys
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            kv_model
                .full
                .keys
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            "chunk {chunk}"
        );
    }
}

/// Prefills sequences `seqs` (greedy, short prompts of their own); their first tokens.
pub(crate) async fn prefill_greedy<V: specd_core::Verifier>(verifier: &V, seqs: &[u64]) -> Vec<u32>
where
    V::Error: std::fmt::Debug,
{
    let mut first = Vec::new();
    for &seq in seqs {
        let prefilled = verifier
            .prefill(core_prefill(
                SeqId(seq),
                prompt(6 + seq as usize, seq as u32),
                SamplingParams::GREEDY,
            ))
            .await
            .unwrap();
        first.push(prefilled.first_token);
    }
    first
}

pub(crate) fn core_prefill(seq: SeqId, prompt: Vec<u32>, sampling: SamplingParams) -> CorePrefill {
    CorePrefill {
        seq,
        prompt_ids: prompt,
        sampling,
        want_carry: false,
        cache_scope: Default::default(),
        rules: Default::default(),
        top_logprobs: None,
        mask: None,
        emitted_in_prompt: 0,
    }
}

fn first_round(seq: u64, token: u32) -> CoreVerify {
    CoreVerify {
        seq: SeqId(seq),
        round: 1,
        tokens: vec![token, 5, 9],
        budget: 8,
        output_index_base: 1,
        want_carry: false,
        masks: Vec::new(),
        parents: Vec::new(),
    }
}

/// Beside a drafter in the same process, a row waits for the sequences drafting now (their
/// verifies follow), so concurrent requests verify together instead of taking turns; without
/// a drafting round it waits only the configured moment, and without the drafter's count it
/// never waits for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_wait_for_sequences_drafting_beside_the_scheduler() {
    use specd_core::Verifier;
    use specd_verifier::batch::DraftingRounds;

    let target = load_target("target-full");
    let (alone, beside) = (
        specd_verifier::BatchVerifier::new(
            Arc::new(local_verifier(target.clone())),
            BatchConfig::default(),
        ),
        // Patience far beyond any pause of this test: the row waits as long as a round drafts.
        DraftingRounds::with_patience(Duration::from_secs(60)),
    );
    let batch = specd_verifier::BatchVerifier::beside(
        Arc::new(local_verifier(target)),
        BatchConfig::default(),
        Some(beside.clone()),
    );
    for verifier in [&alone, &batch] {
        let first = prefill_greedy(verifier, &[1, 2]).await;
        // Sequence 2 is drafting while sequence 1's round waits.
        let drafting = beside.start();
        let (one, (waited, two)) = tokio::join!(verifier.verify(first_round(1, first[0])), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let waited = verifier.stats().batches_run == 0;
            drop(drafting);
            (waited, verifier.verify(first_round(2, first[1])).await)
        });
        assert!(!one.unwrap().new_tokens.is_empty() && !two.unwrap().new_tokens.is_empty());
        let stats = verifier.stats();
        if std::ptr::eq(verifier, &batch) {
            assert!(waited, "the row ran while a sequence drafted: {stats:?}");
            assert_eq!(stats.batches_run, 1, "{stats:?}");
            assert_eq!(stats.largest_batch_rows, 2, "{stats:?}");
        } else {
            // Unaware of the drafting, the scheduler runs the row alone.
            assert_eq!(stats.batches_run, 2, "{stats:?}");
        }
        for seq in [1, 2] {
            verifier.release(SeqId(seq)).await.unwrap();
        }
    }
}
