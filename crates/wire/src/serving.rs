//! One specd gRPC service on a listening socket beside health and reflection, with the drain
//! every specd server does before it stops.

use std::convert::Infallible;
use std::future::Future;

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Mutex};
use tonic::body::Body;
use tonic::codegen::{http, Service};
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

use crate::descriptor::{reflection_service, ReflectionError, SpecdService};
use crate::draining::{DrainSwitch, RefuseWhileDraining};
use crate::health::HealthState;
use crate::idle::{expire_idle, IdleWork};
use crate::tls::ServerTls;

/// How a server listens: TLS, reflection, and the HTTP/2 limits every connection gets.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// TLS (and mutual TLS) on the listener; `None` serves plaintext.
    pub tls: Option<ServerTls>,
    /// Serve gRPC server reflection beside the service.
    pub reflection: bool,
    /// HTTP/2 keepalive pings this often, so dead peers are noticed and their calls end;
    /// `None` sends none.
    pub keepalive: Option<Duration>,
    /// How long a keepalive ping may go unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
    /// Streams one connection may have open at once.
    pub max_concurrent_streams: u32,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            tls: None,
            reflection: true,
            keepalive: Some(Duration::from_secs(30)),
            keepalive_timeout: Duration::from_secs(20),
            max_concurrent_streams: 256,
        }
    }
}

/// The server could not start or failed while serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Reflection(#[from] ReflectionError),
    #[error("{server} TLS: {source}")]
    Tls {
        server: &'static str,
        source: tonic::transport::Error,
    },
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

/// How a service that holds per-request work (a verifier's sequences, a drafter's sessions)
/// drains: the calls that start new work are refused, and the server stops once no work is
/// live.
pub struct WorkDrain<W> {
    /// Calls refused with UNAVAILABLE while draining.
    pub refuse: &'static [&'static str],
    /// The work; draining ends when none is live. Its expiry bounds the wait if a client
    /// vanished.
    pub work: Arc<W>,
    /// Work idle this long expires (checked a few times per timeout); `None`: never.
    pub idle_timeout: Option<Duration>,
    /// What draining means for this server, for the log.
    pub what: &'static str,
}

/// How often a draining server looks whether its last work has ended.
const WORK_DRAIN_POLL: Duration = Duration::from_millis(50);

/// [`serve_draining`] for a service holding per-request work, expiring idle work and
/// draining as `drain` says.
pub async fn serve_work<S, W>(
    hosted: SpecdService,
    options: &ServeOptions,
    server: S,
    incoming: TcpIncoming,
    trace: fn(&http::Request<()>) -> tracing::Span,
    shutdown: impl Future<Output = ()> + Send,
    drain: WorkDrain<W>,
) -> Result<(), ServeError>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    W: IdleWork,
{
    if let Some(timeout) = drain.idle_timeout {
        tokio::spawn(expire_idle(Arc::downgrade(&drain.work), timeout));
    }
    let switch = DrainSwitch::default();
    let server = RefuseWhileDraining::new(server, switch.clone(), drain.refuse);
    let work = drain.work;
    let drain = Drain {
        begin: move || switch.start(),
        finished: async move {
            while work.live() > 0 {
                tokio::time::sleep(WORK_DRAIN_POLL).await;
            }
        },
        what: drain.what,
    };
    serve_draining(
        hosted, options, server, incoming, trace, shutdown, drain, None,
    )
    .await
}

/// Serves `server` (the gRPC service `hosted`) on `incoming`, every call in its own span from
/// `trace`, until `shutdown` resolves; then drains: `drain.begin` runs, health turns
/// NOT_SERVING, and the server stops once `drain.finished` resolves. Whatever `server` needs
/// loaded is loaded by the time it exists, so health reports SERVING from the start, unless
/// `available` says otherwise: until the drain, health follows it (a router whose verifiers
/// all stopped answering is NOT_SERVING). `options` say how connections are served.
#[allow(clippy::too_many_arguments)]
pub async fn serve_draining<S, B, W>(
    hosted: SpecdService,
    options: &ServeOptions,
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
    let reflection = if options.reflection {
        Some(reflection_service(&services)?)
    } else {
        None
    };
    let mut builder = Server::builder()
        .http2_keepalive_interval(options.keepalive)
        .http2_keepalive_timeout(Some(options.keepalive_timeout))
        .max_concurrent_streams(Some(options.max_concurrent_streams.max(1)));
    if let Some(tls) = &options.tls {
        builder = builder
            .tls_config(tls.grpc())
            .map_err(|source| ServeError::Tls {
                server: hosted.server(),
                source,
            })?;
    }
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
    builder
        .trace_fn(trace)
        .add_service(health_service)
        .add_optional_service(reflection)
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
