//! The public `specd.v1.Generation` service.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use specd_telemetry::record::ActiveRequest;
use specd_wire::generation::{
    GenerateRequest, GenerateResponse, GenerateStreamResponse, Generation,
};
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{debug, warn, Instrument};

use crate::admission::Admitted;
use crate::auth::KeyGrant;
use crate::cache_scope::{check_salt, scope_of};
use crate::config::{RouterConfig, TargetLimits};
use crate::deadline::request_deadline;
use crate::drafters::{DraftSource, DrafterSetupError, Drafters};
use crate::in_process::InProcessEngine;
use crate::predraft::PredraftCounts;
use crate::report::RequestFacts;
use crate::run::{Backend, RequestScope, RouterState};
use crate::sink::{send_unless_stalled, CollectSink, StreamSink};
use crate::upstream::Upstream;
use crate::validate::{plan, Plan};
use crate::verifiers::{PoolError, VerifierPool, VerifierSource};
use specd_text::TargetText;

/// Messages buffered per stream before the round loop waits for the client.
const STREAM_BUFFER: usize = 16;

/// The longest a draining router waits for detached releases and closes.
const CLEANUP_GRACE: Duration = Duration::from_secs(10);

/// The router could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RouterSetupError {
    #[error(transparent)]
    Verifiers(#[from] PoolError),
    #[error(transparent)]
    Drafters(#[from] DrafterSetupError),
}

/// The Generation service: one round loop per request.
#[derive(Clone)]
pub struct GenerationService {
    state: Arc<RouterState>,
    /// Turns to tokenize a prompt (and validate its request) on the blocking pool.
    tokenizing: Arc<Semaphore>,
}

impl GenerationService {
    /// Connects to the verifiers of `verifiers`, waiting up to `wait` for one to answer its
    /// Stats (it may still be loading), and sets up the drafters.
    pub async fn connect(
        verifiers: &VerifierSource,
        source: &DraftSource,
        text: TargetText,
        config: RouterConfig,
        wait: Duration,
    ) -> Result<Self, RouterSetupError> {
        let upstream = Upstream {
            limits: config.limits,
            tls: config.upstream_tls.clone(),
        };
        let pool = VerifierPool::connect(verifiers, &upstream, wait).await?;
        let limits = pool.target().clone();
        if text.eos_token_ids().is_empty() {
            warn!("no end-of-sequence ids known: generation stops only at max_tokens or stop");
        }
        let drafters = Drafters::new(source, &upstream)?;
        if let Some(pool) = drafters.pool() {
            pool.expect_vocab(limits.vocab_size);
        }
        let tokenizing = Arc::new(Semaphore::new(config.requests.tokenizer_threads.max(1)));
        Ok(Self {
            tokenizing,
            state: Arc::new(RouterState::new(
                Backend::Remote(pool),
                limits,
                config,
                drafters,
                Arc::new(text),
            )),
        })
    }

    /// A router whose requests run on `engine`, a verifier and drafter in this process.
    pub fn in_process(
        engine: Arc<dyn InProcessEngine>,
        text: TargetText,
        config: RouterConfig,
    ) -> Self {
        let limits = engine.limits();
        if text.eos_token_ids().is_empty() {
            warn!("no end-of-sequence ids known: generation stops only at max_tokens or stop");
        }
        let tokenizing = Arc::new(Semaphore::new(config.requests.tokenizer_threads.max(1)));
        Self {
            tokenizing,
            state: Arc::new(RouterState::new(
                Backend::InProcess(engine),
                limits,
                config,
                Drafters::None,
                Arc::new(text),
            )),
        }
    }

    pub fn config(&self) -> &RouterConfig {
        &self.state.config
    }

    /// The target's tokenizer, chat template and stop ids.
    pub(crate) fn text(&self) -> &TargetText {
        &self.state.text
    }

    /// What the verifier reported about the target.
    pub fn target_limits(&self) -> &TargetLimits {
        &self.state.limits
    }
}

/// A request past validation and admission, ready to run.
struct Prepared {
    plan: Plan,
    facts: RequestFacts,
    scope: RequestScope,
    admitted: Admitted,
    /// The client's API key and its place under the key's limit, held while the request runs.
    grant: Option<KeyGrant>,
}

impl GenerationService {
    /// What the unary and streaming calls share: the API key, the deadline, validation,
    /// admission.
    async fn prepare(&self, request: Request<GenerateRequest>) -> Result<Prepared, Status> {
        let started = Instant::now();
        let authorization = request
            .metadata()
            .get("authorization")
            .map(|value| value.to_str().unwrap_or_default());
        let grant = self.authorize(authorization)?;
        let deadline = request_deadline(request.metadata(), started)?;
        self.prepare_at(request.into_inner(), started, deadline, grant)
            .await
    }

    /// Checks an `authorization` value against the router's API keys; `None` when the API
    /// is open.
    pub(crate) fn authorize(
        &self,
        authorization: Option<&str>,
    ) -> Result<Option<KeyGrant>, Status> {
        match &self.state.config.api_keys {
            None => Ok(None),
            Some(keys) => {
                let grant = keys.authorize(authorization)?;
                debug!(key = %grant.name, "authorized");
                Ok(Some(grant))
            }
        }
    }

    async fn prepare_at(
        &self,
        request: GenerateRequest,
        started: Instant,
        deadline: Option<Instant>,
        grant: Option<KeyGrant>,
    ) -> Result<Prepared, Status> {
        let state = &self.state;
        state.config.requests.check(&request)?;
        check_salt(&request.cache_salt)?;
        let cache_scope = scope_of(
            state.config.prefix_cache_scope,
            grant.as_ref().map(|grant| grant.name.as_str()),
            &request.cache_salt,
        );
        // Admitted before tokenizing, so prompts waiting for the tokenizer are bounded by the
        // router's capacity; a request that fails validation gives its place back at once.
        let admitted = state.admission.admit()?;
        let plan = self.plan_off_runtime(request).await?;
        let resyncs = Arc::new(AtomicU32::new(0));
        let migrations = Arc::new(AtomicU32::new(0));
        let predraft = Arc::new(PredraftCounts::default());
        let facts = RequestFacts {
            started,
            prompt_tokens: plan.prompt_ids.len(),
            seed: plan.sampling.seed,
            context_capped: plan.context_capped,
            stop: plan.stop.clone(),
            resyncs: resyncs.clone(),
            migrations: migrations.clone(),
            predraft: predraft.clone(),
        };
        Ok(Prepared {
            plan,
            facts,
            scope: RequestScope {
                deadline,
                cache_scope,
                resyncs,
                migrations,
                predraft,
            },
            admitted,
            grant,
        })
    }

    /// Validates `request`, tokenizing its prompt, on the blocking pool and at most
    /// `tokenizer_threads` at once, so long prompts never stall the async runtime (and the
    /// health checks and streams it serves).
    async fn plan_off_runtime(&self, request: GenerateRequest) -> Result<Plan, Status> {
        let _turn = self
            .tokenizing
            .acquire()
            .await
            .map_err(|_| Status::unavailable("router: shutting down"))?;
        let state = self.state.clone();
        tokio::task::spawn_blocking(move || {
            let mut request = request;
            let constraint = request.constraint.take();
            let mut plan = plan(request, &state.limits, &state.config, &state.text)?;
            plan.constraint = state.grammars.compile(constraint.as_ref())?;
            Ok(plan)
        })
        .await
        .map_err(|_| Status::internal("validating the request failed"))?
    }

    /// Stops taking requests: new ones are refused with UNAVAILABLE.
    pub(crate) fn start_drain(&self) {
        self.state.admission.start_drain();
    }

    /// Resolves once no request runs and the releases and closes that requests left
    /// behind have reached the verifier and drafters (for at most [`CLEANUP_GRACE`]).
    pub(crate) async fn drained(&self) {
        self.state.admission.drained().await;
        crate::detached::settled(CLEANUP_GRACE).await;
    }
}

#[tonic::async_trait]
impl Generation for GenerationService {
    type GenerateStreamStream = ReceiverStream<Result<GenerateStreamResponse, Status>>;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<GenerateResponse>, Status> {
        let Prepared {
            plan,
            facts,
            scope,
            admitted,
            grant: _grant,
        } = self.prepare(request).await?;
        let _active = ActiveRequest::start();
        let state = &self.state;
        let mut sink = CollectSink::default();
        // A client that cancels drops this future; the round loop's guard then frees the
        // verifier sequence and drafter session in the background.
        let finish = state
            .run(plan, &mut sink, admitted.control(), &scope)
            .await?;
        let report = facts.report(&finish, &sink.transcript, &state.text);
        Ok(Response::new(GenerateResponse {
            token_ids: sink.transcript.tokens,
            text: sink.transcript.text,
            finish_reason: report.finish_reason.into(),
            stats: Some(report.stats),
            matched_stop: report.matched_stop,
            logprobs: sink.logprobs,
        }))
    }

    async fn generate_stream(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStreamStream>, Status> {
        let prepared = self.prepare(request).await?;
        Ok(Response::new(ReceiverStream::new(self.stream(prepared))))
    }
}

impl GenerationService {
    /// Validates, admits and starts `request` as a stream of messages, as GenerateStream
    /// does: the HTTP API's way in. Dropping the receiver cancels the request.
    pub(crate) async fn start_stream(
        &self,
        request: GenerateRequest,
        deadline: Option<Instant>,
        grant: Option<KeyGrant>,
    ) -> Result<mpsc::Receiver<Result<GenerateStreamResponse, Status>>, Status> {
        let prepared = self
            .prepare_at(request, Instant::now(), deadline, grant)
            .await?;
        Ok(self.stream(prepared))
    }

    /// Follows whether any verifier replica answers.
    pub fn verifier_reachable(&self) -> tokio::sync::watch::Receiver<bool> {
        match &self.state.backend {
            Backend::Remote(verifiers) => verifiers.reachable(),
            // The verifier is this process: it answers while the server does.
            Backend::InProcess(_) => tokio::sync::watch::channel(true).1,
        }
    }

    /// Whether the router is draining (refusing new requests).
    pub(crate) fn is_draining(&self) -> bool {
        self.state.admission.is_draining()
    }

    fn stream(
        &self,
        Prepared {
            plan,
            facts,
            scope,
            admitted,
            grant,
        }: Prepared,
    ) -> mpsc::Receiver<Result<GenerateStreamResponse, Status>> {
        let state = self.state.clone();
        let (sender, receiver) = mpsc::channel(STREAM_BUFFER);
        let active = ActiveRequest::start();
        // The request's spans stay in the trace of the call that started it.
        let call_span = tracing::Span::current();
        tokio::spawn(
            async move {
                let _active = active;
                let watch = sender.clone();
                let stall = state.config.requests.stream_stall_timeout;
                let mut sink = StreamSink::new(sender, facts, state.text.clone(), stall)
                    .marking(admitted.answer_done());
                tokio::select! {
                    result = state.run(plan, &mut sink, admitted.control(), &scope) => {
                        if let Err(status) = result {
                            // A client that stopped reading does not hold the request here.
                            let _ = send_unless_stalled(&watch, Err(status), stall).await;
                        }
                    }
                    // The client is gone: dropping the round loop frees its sequence and session.
                    () = watch.closed() => debug!("stream client went away; request dropped"),
                }
                // The request holds its place until its last message is queued.
                drop(admitted);
                drop(grant);
            }
            .instrument(call_span),
        );
        receiver
    }
}
