//! A verifier server on an ephemeral port and helpers to drive it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device};
use specd_verifier::server::{serve, VerifierServerConfig, VerifierService};
use specd_verifier::{
    BatchConfig, BatchVerifier, Gemma4Target, KvBudget, LocalVerifier, TargetModel, VerifierLimits,
};
use specd_wire::verifier::{
    prefill_response, PrefillHead, PrefillRequest, VerifierClient, VerifierStatsRequest,
    VerifyRequest, VerifyResponse,
};
use specd_wire::{Sampling, SnapshotChunk};
use tokio::sync::oneshot;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Channel;
use tonic::Status;

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../crates/models/tests/fixtures/gemma4")
        .join(name)
}

pub fn load_target(name: &str) -> Arc<Gemma4Target> {
    Arc::new(Gemma4Target::load(&fixture(name), DType::F32, &Device::Cpu).unwrap())
}

/// The target fixture prefilling in pieces of `chunk` tokens.
pub fn target_with_chunk(chunk: usize) -> Gemma4Target {
    Gemma4Target::load(&fixture("target-full"), DType::F32, &Device::Cpu)
        .unwrap()
        .with_prefill_chunk(chunk)
}

/// A running verifier; dropping it stops the server.
pub struct TestVerifier<T: TargetModel = Gemma4Target> {
    pub addr: SocketAddr,
    /// The scheduler behind the server, for its counters.
    pub batcher: Arc<BatchVerifier<T>>,
    _stop: oneshot::Sender<()>,
}

pub struct Options {
    pub max_sequences: usize,
    pub idle_timeout: Option<Duration>,
    pub batch: BatchConfig,
    pub kv_budget: KvBudget,
    /// Prefill piece length of the target; `None` keeps the model's default.
    pub prefill_chunk: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_sequences: 64,
            idle_timeout: None,
            batch: BatchConfig::default(),
            kv_budget: KvBudget::default(),
            prefill_chunk: None,
        }
    }
}

impl TestVerifier {
    pub async fn start() -> Self {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(options: Options) -> Self {
        let target = match options.prefill_chunk {
            Some(chunk) => Arc::new(target_with_chunk(chunk)),
            None => load_target("target-full"),
        };
        let local = LocalVerifier::new(
            target,
            VerifierLimits {
                max_sequences: options.max_sequences,
            },
        )
        .with_kv_budget(options.kv_budget);
        let config = VerifierServerConfig {
            idle_timeout: options.idle_timeout,
            model_name: "target-full".into(),
            batch: options.batch,
            ..VerifierServerConfig::default()
        };
        Self::serving(local, config).await
    }
}

impl<T: TargetModel> TestVerifier<T> {
    /// A server for `local` (any target) with `config`.
    pub async fn serving(local: LocalVerifier<T>, config: VerifierServerConfig) -> Self {
        let service = VerifierService::new(Arc::new(local), config);
        let batcher = service.batcher();
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
        Self {
            addr,
            batcher,
            _stop: stop,
        }
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    pub async fn client(&self) -> VerifierClient<Channel> {
        VerifierClient::new(self.channel().await)
    }
}

pub fn greedy() -> Option<Sampling> {
    Some(Sampling {
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: 0,
    })
}

pub fn prefill_request(prompt: &[u32], with_mtp_state: bool) -> PrefillRequest {
    PrefillRequest {
        prompt_ids: prompt.to_vec(),
        sampling: greedy(),
        max_new_tokens: 64,
        with_mtp_state,
        max_chunk_bytes: 0,
        cache_scope: Default::default(),
        ..Default::default()
    }
}

/// A prefill read to the end: the head and the snapshot chunks.
pub struct Prefilled {
    pub head: PrefillHead,
    pub snapshot: Vec<SnapshotChunk>,
}

pub async fn prefill(
    client: &mut VerifierClient<Channel>,
    request: PrefillRequest,
) -> Result<Prefilled, Status> {
    let mut stream = client.prefill(request).await?.into_inner();
    let mut head = None;
    let mut snapshot = Vec::new();
    while let Some(message) = stream.message().await? {
        match message.body.unwrap() {
            prefill_response::Body::Head(h) => {
                assert!(head.is_none(), "one head per stream");
                head = Some(h);
            }
            prefill_response::Body::Snapshot(chunk) => {
                assert!(head.is_some(), "the head comes first");
                snapshot.push(chunk);
            }
        }
    }
    Ok(Prefilled {
        head: head.expect("a head"),
        snapshot,
    })
}

pub fn verify_request(
    seq_id: &str,
    round: u64,
    tokens: &[u32],
    output_index_base: u32,
    committed_len: u32,
) -> VerifyRequest {
    VerifyRequest {
        seq_id: seq_id.to_owned(),
        round,
        tokens: tokens.to_vec(),
        budget: 1000,
        output_index_base,
        committed_len,
        ..Default::default()
    }
}

pub async fn verify(
    client: &mut VerifierClient<Channel>,
    request: VerifyRequest,
) -> Result<VerifyResponse, Status> {
    Ok(client.verify(request).await?.into_inner())
}

pub async fn live_sequences(client: &mut VerifierClient<Channel>) -> u32 {
    client
        .stats(VerifierStatsRequest {})
        .await
        .unwrap()
        .into_inner()
        .live_sequences
}

/// Polls Stats until no sequence is live; false if some are still live after a generous
/// wait (cleanup runs in the background, so it may lag the client's last call).
pub async fn drained(client: &mut VerifierClient<Channel>) -> bool {
    for _ in 0..200 {
        if live_sequences(client).await == 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

pub const PROMPT: [u32; 12] = [2, 17, 101, 45, 9, 200, 17, 101, 45, 77, 3, 64];

/// A prefill of `prompt` for sequence `seq` through core's [`specd_core::Verifier`], with no
/// rules, masks or log-probabilities; `want_carry` asks for the hidden state (and shared
/// K/V) a drafter would get.
pub fn core_prefill(
    seq: u64,
    prompt: Vec<u32>,
    sampling: specd_core::SamplingParams,
    want_carry: bool,
    cache_scope: specd_core::CacheScope,
) -> specd_core::PrefillRequest {
    specd_core::PrefillRequest {
        seq: specd_core::SeqId(seq),
        prompt_ids: prompt,
        sampling,
        want_carry,
        cache_scope,
        rules: Default::default(),
        top_logprobs: None,
        mask: None,
        emitted_in_prompt: 0,
    }
}

/// Round `round` of `seq` verifying `tokens` (the bonus, then drafts), `emitted` tokens out
/// so far and at most `budget` more.
pub fn round_request(
    seq: u64,
    round: u32,
    tokens: Vec<u32>,
    emitted: usize,
    budget: usize,
) -> specd_core::VerifyRequest {
    specd_core::VerifyRequest {
        seq: specd_core::SeqId(seq),
        round,
        tokens,
        budget,
        output_index_base: emitted as u64,
        want_carry: false,
        masks: Vec::new(),
        parents: Vec::new(),
    }
}

/// Round `round` of plain decoding for `seq`, whose emitted tokens so far are `emitted`: its
/// last token verified alone, one token out.
pub fn plain_round(seq: u64, round: u32, emitted: &[u32]) -> specd_core::VerifyRequest {
    let bonus = emitted.last().copied().into_iter().collect();
    round_request(seq, round, bonus, emitted.len(), 1)
}
