//! The public `specd.v1.Generation` service.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use specd_telemetry::record::ActiveRequest;
use specd_wire::generation::{
    GenerateRequest, GenerateResponse, GenerateStreamResponse, Generation,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{debug, warn, Instrument};

use crate::admission::Admitted;
use crate::config::{RouterConfig, TargetLimits};
use crate::deadline::request_deadline;
use crate::drafters::{DraftSource, DrafterSetupError, Drafters};
use crate::predraft::PredraftCounts;
use crate::report::RequestFacts;
use crate::run::{RequestScope, RouterState};
use crate::sink::{CollectSink, StreamSink};
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
        let pool = VerifierPool::connect(verifiers, &config.limits, wait).await?;
        let limits = pool.target().clone();
        if text.eos_token_ids().is_empty() {
            warn!("no end-of-sequence ids known: generation stops only at max_tokens or stop");
        }
        let drafters = Drafters::new(source, &config.limits)?;
        if let Some(pool) = drafters.pool() {
            pool.expect_vocab(limits.vocab_size);
        }
        Ok(Self {
            state: Arc::new(RouterState::new(
                pool,
                limits,
                config,
                drafters,
                Arc::new(text),
            )),
        })
    }

    pub fn config(&self) -> &RouterConfig {
        &self.state.config
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
}

impl GenerationService {
    /// What the unary and streaming calls share: the deadline, validation, admission.
    fn prepare(&self, request: Request<GenerateRequest>) -> Result<Prepared, Status> {
        let started = Instant::now();
        let deadline = request_deadline(request.metadata(), started)?;
        self.prepare_at(request.into_inner(), started, deadline)
    }

    fn prepare_at(
        &self,
        request: GenerateRequest,
        started: Instant,
        deadline: Option<Instant>,
    ) -> Result<Prepared, Status> {
        let state = &self.state;
        let plan = plan(request, &state.limits, &state.config, &state.text)?;
        let admitted = state.admission.admit()?;
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
                resyncs,
                migrations,
                predraft,
            },
            admitted,
        })
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
        } = self.prepare(request)?;
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
        }))
    }

    async fn generate_stream(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStreamStream>, Status> {
        let prepared = self.prepare(request)?;
        Ok(Response::new(ReceiverStream::new(self.stream(prepared))))
    }
}

impl GenerationService {
    /// Validates, admits and starts `request` as a stream of messages, as GenerateStream
    /// does: the HTTP API's way in. Dropping the receiver cancels the request.
    pub(crate) fn start_stream(
        &self,
        request: GenerateRequest,
        deadline: Option<Instant>,
    ) -> Result<mpsc::Receiver<Result<GenerateStreamResponse, Status>>, Status> {
        let prepared = self.prepare_at(request, Instant::now(), deadline)?;
        Ok(self.stream(prepared))
    }

    /// Follows whether any verifier replica answers.
    pub fn verifier_reachable(&self) -> tokio::sync::watch::Receiver<bool> {
        self.state.verifiers.reachable()
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
                let mut sink = StreamSink::new(sender, facts, state.text.clone());
                tokio::select! {
                    result = state.run(plan, &mut sink, admitted.control(), &scope) => {
                        if let Err(status) = result {
                            let _ = watch.send(Err(status)).await;
                        }
                    }
                    // The client is gone: dropping the round loop frees its sequence and session.
                    () = watch.closed() => debug!("stream client went away; request dropped"),
                }
                // The request holds its place until its last message is queued.
                drop(admitted);
            }
            .instrument(call_span),
        );
        receiver
    }
}
