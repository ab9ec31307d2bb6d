//! Real servers on ephemeral ports: a verifier, drafters and routers.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device};
use specd_core::hybrid::HYBRID_LOOKUP;
use specd_core::NgramConfig;
use specd_drafter::{DraftEngine, DrafterServerConfig, DrafterService, MtpEngine};

use crate::random_engine::RandomDrafts;
use specd_router::{DraftSource, GenerationService, RouterConfig, TargetText, VerifierSource};
use specd_verifier::server::{VerifierServerConfig, VerifierService};
use specd_verifier::{Gemma4Target, LocalVerifier, VerifierLimits};
use specd_wire::drafter::{DrafterClient, DrafterKind, DrafterStatsRequest};
use specd_wire::generation::{
    generate_request, GenerateRequest, GenerateResponse, GenerationClient, SamplingParams,
    SpeculativeParams, TokenIds,
};
use specd_wire::verifier::{VerifierClient, VerifierStatsRequest};
use tokio::sync::oneshot;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Channel;
use tonic::Status;

/// A fresh target directory with the fixture's config and a word-level tokenizer whose token
/// `i` is the word `w{i}` (one per call: tests running at once never share files).
pub fn word_level_target(name: &str) -> (PathBuf, tokenizers::Tokenizer) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::WhitespaceSplit;
    static MADE: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "specd-router-{name}-{}-{}",
        std::process::id(),
        MADE.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        fixture("target-full").join("config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    let vocab: std::collections::HashMap<String, u32> =
        (0..256u32).map(|i| (format!("w{i}"), i)).collect();
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("w0".into())
        .build()
        .unwrap();
    let mut tokenizer = tokenizers::Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(WhitespaceSplit));
    tokenizer.save(dir.join("tokenizer.json"), false).unwrap();
    (dir, tokenizer)
}

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../crates/models/tests/fixtures/gemma4")
        .join(name)
}

/// A running server; dropping it stops the server.
pub struct Running {
    pub addr: SocketAddr,
    /// A router's OpenAI-compatible HTTP API.
    pub http: Option<SocketAddr>,
    _stop: oneshot::Sender<()>,
    _stop_http: Option<oneshot::Sender<()>>,
}

impl Running {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.url())
            .unwrap()
            .connect()
            .await
            .unwrap()
    }
}

fn bind() -> (TcpIncoming, SocketAddr) {
    let incoming = TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = incoming.local_addr().unwrap();
    (incoming, addr)
}

pub async fn start_verifier(max_sequences: usize) -> Running {
    let target = Gemma4Target::load(&fixture("target-full"), DType::F32, &Device::Cpu).unwrap();
    let local = LocalVerifier::new(Arc::new(target), VerifierLimits { max_sequences });
    let service = VerifierService::new(Arc::new(local), VerifierServerConfig::default());
    serve_verifier(service).await
}

/// Serves `service` on a free port of 127.0.0.1.
pub async fn serve_verifier<T: specd_verifier::TargetModel>(
    service: VerifierService<T>,
) -> Running {
    let (incoming, addr) = bind();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        specd_verifier::server::serve(service, incoming, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    Running {
        addr,
        http: None,
        _stop: stop,
        _stop_http: None,
    }
}

pub async fn start_drafter<E: DraftEngine>(engine: E) -> Running {
    let service = DrafterService::new(Arc::new(engine), DrafterServerConfig::default()).unwrap();
    let (incoming, addr) = bind();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        specd_drafter::serve(service, incoming, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    Running {
        addr,
        http: None,
        _stop: stop,
        _stop_http: None,
    }
}

/// The drafters the tests speculate with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrafterSetup {
    /// Prompt lookup inside the router.
    Ngram,
    /// The Gemma 4 assistant fixture behind a drafter service.
    Mtp,
    /// Random drafts through the MTP protocol (snapshot and K/V deltas).
    RandomMtp,
    /// Random drafts through the draft-model protocol (committed tokens).
    RandomDraftModel,
    /// Prompt lookup in the router in front of the assistant fixture's drafter service.
    HybridMtp,
    /// Prompt lookup in the router in front of random drafts through the draft-model
    /// protocol.
    HybridRandomDraftModel,
}

impl DrafterSetup {
    fn is_hybrid(self) -> bool {
        matches!(
            self,
            DrafterSetup::HybridMtp | DrafterSetup::HybridRandomDraftModel
        )
    }
}

pub async fn start_drafter_for(setup: DrafterSetup) -> Option<Running> {
    match setup {
        DrafterSetup::Ngram => None,
        DrafterSetup::Mtp | DrafterSetup::HybridMtp => Some(
            start_drafter(
                MtpEngine::load(
                    &fixture("assistant-dense"),
                    &fixture("target-full"),
                    DType::F32,
                    &Device::Cpu,
                )
                .unwrap(),
            )
            .await,
        ),
        DrafterSetup::RandomMtp => {
            Some(start_drafter(RandomDrafts::new(DrafterKind::Mtp, 256, 16, 9)).await)
        }
        DrafterSetup::RandomDraftModel | DrafterSetup::HybridRandomDraftModel => {
            Some(start_drafter(RandomDrafts::new(DrafterKind::DraftModel, 256, 16, 9)).await)
        }
    }
}

pub async fn start_router(verifier: &Running, source: DraftSource, target_dir: &Path) -> Running {
    let config = RouterConfig {
        default_max_tokens: 24,
        ..RouterConfig::default()
    };
    start_router_with(verifier, source, target_dir, config).await
}

pub async fn start_router_with(
    verifier: &Running,
    source: DraftSource,
    target_dir: &Path,
    config: RouterConfig,
) -> Running {
    let text = TargetText::from_dir(target_dir).unwrap();
    let service = GenerationService::connect(
        &VerifierSource::single(verifier.url()),
        &source,
        text,
        config,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let (incoming, addr) = bind();
    let (stop, stopped) = oneshot::channel::<()>();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = listener.local_addr().unwrap();
    let (stop_http, http_stopped) = oneshot::channel::<()>();
    tokio::spawn(specd_router::serve_http(
        service.clone(),
        listener,
        Some(SERVED_MODEL.into()),
        async {
            let _ = http_stopped.await;
        },
    ));
    tokio::spawn(async move {
        specd_router::serve(service, incoming, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    Running {
        addr,
        http: Some(http),
        _stop: stop,
        _stop_http: Some(stop_http),
    }
}

/// The model name the test routers serve over HTTP.
pub const SERVED_MODEL: &str = "tiny-gemma4";

/// A verifier, the drafter of `setup` and a router speculating with it.
pub struct Stack {
    pub verifier: Running,
    pub drafter: Option<Running>,
    pub router: Running,
}

impl Stack {
    pub async fn start(setup: Option<DrafterSetup>) -> Self {
        Self::start_in(setup, &fixture("target-full")).await
    }

    pub async fn start_in(setup: Option<DrafterSetup>, target_dir: &Path) -> Self {
        let verifier = start_verifier(64).await;
        let drafter = match setup {
            Some(setup) => start_drafter_for(setup).await,
            None => None,
        };
        let source = match (setup, &drafter) {
            (Some(DrafterSetup::Ngram), _) => DraftSource::Ngram(NgramConfig::default()),
            (Some(setup), Some(drafter)) if setup.is_hybrid() => DraftSource::Hybrid {
                urls: vec![drafter.url()],
                dns: None,
                lookup: HYBRID_LOOKUP,
            },
            (_, Some(drafter)) => DraftSource::Remote(vec![drafter.url()]),
            _ => DraftSource::None,
        };
        let router = start_router(&verifier, source, target_dir).await;
        Self {
            verifier,
            drafter,
            router,
        }
    }

    pub async fn client(&self) -> GenerationClient<Channel> {
        GenerationClient::new(self.router.channel().await)
    }

    pub async fn live_sequences(&self) -> u32 {
        VerifierClient::new(self.verifier.channel().await)
            .stats(VerifierStatsRequest {})
            .await
            .unwrap()
            .into_inner()
            .live_sequences
    }

    pub async fn live_sessions(&self) -> u32 {
        match &self.drafter {
            Some(drafter) => {
                DrafterClient::new(drafter.channel().await)
                    .stats(DrafterStatsRequest {})
                    .await
                    .unwrap()
                    .into_inner()
                    .live_sessions
            }
            None => 0,
        }
    }

    /// Waits for background cleanup; false if sequences or sessions are still live after a
    /// generous wait.
    pub async fn drained(&self) -> bool {
        for _ in 0..200 {
            if self.live_sequences().await == 0 && self.live_sessions().await == 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        false
    }
}

/// Repetitive enough that prompt lookup finds continuations.
pub const PROMPT: [u32; 16] = [2, 40, 41, 42, 43, 9, 40, 41, 42, 43, 9, 40, 41, 42, 43, 9];

pub fn ids_request(prompt: &[u32], max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        input: Some(generate_request::Input::PromptIds(TokenIds {
            ids: prompt.to_vec(),
        })),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..GenerateRequest::default()
    }
}

pub fn sampled(request: GenerateRequest, temperature: f32, seed: u64) -> GenerateRequest {
    GenerateRequest {
        sampling: Some(SamplingParams {
            temperature: Some(temperature),
            top_p: None,
            top_k: None,
            seed: Some(seed),
            ..Default::default()
        }),
        ..request
    }
}

pub fn with_block(
    request: GenerateRequest,
    block_size: Option<u32>,
    disabled: bool,
) -> GenerateRequest {
    GenerateRequest {
        speculative: Some(SpeculativeParams {
            block_size,
            disabled,
            ..Default::default()
        }),
        ..request
    }
}

pub async fn generate(
    client: &mut GenerationClient<Channel>,
    request: GenerateRequest,
) -> Result<GenerateResponse, Status> {
    Ok(client.generate(request).await?.into_inner())
}
