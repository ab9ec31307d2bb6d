//! A verifier and drafter in the router's own process (`specd serve` with no service
//! name): requests run the same round loop over in-process interfaces, with no gRPC hop
//! and no tensor encoding between the three. The engine is built where the models are
//! known; the router sees it only through [`InProcessEngine`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use specd_core::round_loop::SinkClosed;
use specd_core::{
    Event, EventSink, Finish, GenerationRequest, RequestControl, RoundLoopError, TokenConstraint,
};
use specd_text::TargetText;
use tokio::sync::mpsc;
use tonic::Status;

use crate::config::TargetLimits;

/// Events of one request, as the engine's round loop sends them to the router.
pub type EventSender = mpsc::Sender<Event>;

/// A request's run, to its end.
pub type EngineRun = Pin<Box<dyn Future<Output = Result<Finish, Status>> + Send>>;

/// The verifier and drafter of a one-process server.
pub trait InProcessEngine: Send + Sync + 'static {
    /// What requests are checked against.
    fn limits(&self) -> TargetLimits;
    /// Whether requests may speculate (a drafter is loaded, or prompt lookup is on).
    fn speculates(&self) -> bool;
    /// Drafter sessions that draft in parallel (0: none).
    fn drafter_parallelism(&self) -> usize;
    /// Runs `request` through the round loop, sending its events to `events`; a closed
    /// receiver cancels it, and dropping the future frees its sequence and session.
    fn run(
        self: Arc<Self>,
        request: GenerationRequest,
        constraint: Option<Box<dyn TokenConstraint>>,
        text: Arc<TargetText>,
        events: EventSender,
        control: RequestControl,
    ) -> EngineRun;
}

/// An [`EventSink`] that hands events to the router's side of a request.
pub struct ChannelSink(pub EventSender);

impl EventSink for ChannelSink {
    fn send(&mut self, event: Event) -> impl Future<Output = Result<(), SinkClosed>> + Send {
        let sender = &self.0;
        async move { sender.send(event).await.map_err(|_| SinkClosed) }
    }
}

/// The public status of a request that failed in the engine's round loop; `status_of`
/// maps the verifier's errors.
pub fn loop_status<E: std::error::Error>(
    error: RoundLoopError<E>,
    status_of: impl FnOnce(E) -> Status,
) -> Status {
    match error {
        RoundLoopError::InvalidRequest(invalid) => {
            Status::invalid_argument(format!("{}: {invalid}", invalid.field()))
        }
        RoundLoopError::Verifier(error) => status_of(error),
        other => Status::internal(other.to_string()),
    }
}

/// Runs `engine`'s request while its events go on to `sink`: the router's sinks (streams,
/// unary collection) stay as they are.
///
/// The round loop runs in a task of its own: an in-process drafter computes on the task's
/// thread (a session's open is a prefill), and the first token must reach the client while it
/// does. Dropping this future aborts that task, which frees the sequence and session.
pub(crate) async fn run_in_process<S: EventSink>(
    engine: &Arc<dyn InProcessEngine>,
    request: GenerationRequest,
    constraint: Option<Box<dyn TokenConstraint>>,
    text: Arc<TargetText>,
    sink: &mut S,
    control: &RequestControl,
) -> Result<Finish, Status> {
    let (events, mut received) = mpsc::channel(EVENTS_BUFFER);
    let run = AbortOnDrop(tokio::spawn(engine.clone().run(
        request,
        constraint,
        text,
        events,
        control.clone(),
    )));
    while let Some(event) = received.recv().await {
        if sink.send(event).await.is_err() {
            // Dropping the receiver tells the round loop its client is gone.
            break;
        }
    }
    drop(received);
    run.finish().await
}

/// A spawned round loop, aborted when the request it serves is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<Result<Finish, Status>>);

impl AbortOnDrop {
    async fn finish(mut self) -> Result<Finish, Status> {
        match (&mut self.0).await {
            Ok(result) => result,
            Err(error) => Err(Status::internal(format!(
                "the request's round loop failed: {error}"
            ))),
        }
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Events buffered between the engine's round loop and the router's sink.
const EVENTS_BUFFER: usize = 16;
