//! One specd gRPC service on a listening socket beside health and reflection, with the drain
//! every specd server does before it stops.

use std::convert::Infallible;
use std::future::Future;

use tonic::body::Body;
use tonic::codegen::{http, Service};
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

use crate::descriptor::{reflection_service, ReflectionError, SpecdService};
use crate::health::HealthState;

/// The server could not start or failed while serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Reflection(#[from] ReflectionError),
    #[error("{server} transport: {source}")]
    Transport {
        server: &'static str,
        source: tonic::transport::Error,
    },
}

/// How a server drains once asked to stop.
pub struct Drain<B, W> {
    /// Starts refusing new work.
    pub begin: B,
    /// Resolves once the work already running has ended.
    pub finished: W,
    /// What draining means for this server, for the log.
    pub what: &'static str,
}

/// Serves `server` (the gRPC service `hosted`) on `incoming`, every call in its own span from
/// `trace`, until `shutdown` resolves; then drains: `drain.begin` runs, health turns
/// NOT_SERVING, and the server stops once `drain.finished` resolves. Whatever `server` needs
/// loaded is loaded by the time it exists, so health reports SERVING from the start.
pub async fn serve_draining<S, B, W>(
    hosted: SpecdService,
    server: S,
    incoming: TcpIncoming,
    trace: fn(&http::Request<()>) -> tracing::Span,
    shutdown: impl Future<Output = ()> + Send,
    drain: Drain<B, W>,
) -> Result<(), ServeError>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: FnOnce() + Send,
    W: Future<Output = ()> + Send,
{
    let services = [hosted];
    let (health, health_service) = HealthState::starting(&services).await;
    let reflection = reflection_service(&services)?;
    let health_on_drain = health.clone();
    let drained = async move {
        shutdown.await;
        (drain.begin)();
        health_on_drain.set_not_serving().await;
        tracing::info!("draining: {}", drain.what);
        drain.finished.await;
        tracing::info!("drained");
    };
    health.set_serving().await;
    Server::builder()
        .trace_fn(trace)
        .add_service(health_service)
        .add_service(reflection)
        .add_service(server)
        // Small per-round messages must not wait for delayed ACKs.
        .serve_with_incoming_shutdown(incoming.with_nodelay(Some(true)), drained)
        .await
        .map_err(|source| ServeError::Transport {
            server: hosted.server(),
            source,
        })
}
