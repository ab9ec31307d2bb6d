//! One specd gRPC service on a listening socket beside health and reflection, with the drain
//! every specd server does before it stops.

use std::convert::Infallible;
use std::future::Future;

use std::sync::Arc;
use tokio::sync::{watch, Mutex};
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
/// loaded is loaded by the time it exists, so health reports SERVING from the start, unless
/// `available` says otherwise: until the drain, health follows it (a router whose verifiers
/// all stopped answering is NOT_SERVING).
pub async fn serve_draining<S, B, W>(
    hosted: SpecdService,
    server: S,
    incoming: TcpIncoming,
    trace: fn(&http::Request<()>) -> tracing::Span,
    shutdown: impl Future<Output = ()> + Send,
    drain: Drain<B, W>,
    available: Option<watch::Receiver<bool>>,
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
    let initially_available = available.as_ref().is_none_or(|a| *a.borrow());
    let services = [hosted];
    let (health, health_service) = HealthState::starting(&services).await;
    let reflection = reflection_service(&services)?;
    // Held while health changes: set once draining, after which nothing else changes it.
    let draining = Arc::new(Mutex::new(false));
    let follower = available.map(|available| {
        tokio::spawn(follow_availability(
            available,
            health.clone(),
            draining.clone(),
        ))
    });
    let health_on_drain = health.clone();
    let drained = async move {
        shutdown.await;
        (drain.begin)();
        {
            let mut draining = draining.lock().await;
            *draining = true;
            health_on_drain.set_not_serving().await;
        }
        if let Some(follower) = follower {
            follower.abort();
        }
        tracing::info!("draining: {}", drain.what);
        drain.finished.await;
        tracing::info!("drained");
    };
    if initially_available {
        health.set_serving().await;
    }
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

/// Reports SERVING while `available` is true and NOT_SERVING while it is false, until the
/// drain begins.
async fn follow_availability(
    mut available: watch::Receiver<bool>,
    health: HealthState,
    draining: Arc<Mutex<bool>>,
) {
    while available.changed().await.is_ok() {
        let now = *available.borrow_and_update();
        let draining = draining.lock().await;
        if *draining {
            return;
        }
        if now {
            health.set_serving().await;
        } else {
            tracing::warn!("no upstream answers: health NOT_SERVING until one does");
            health.set_not_serving().await;
        }
    }
}
