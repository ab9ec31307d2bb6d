//! A router server on a listening socket: the Generation service, health and reflection.

use std::future::Future;

use specd_wire::descriptor::{reflection_service, ReflectionError, SpecdService};
use specd_wire::generation::GenerationServer;
use specd_wire::health::HealthState;
use specd_wire::limits::WithMessageLimits;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tracing::info;

use crate::service::GenerationService;

/// The server could not start or failed while serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Reflection(#[from] ReflectionError),
    #[error("router transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves `service` on `incoming` until `shutdown` resolves, then drains: health turns
/// NOT_SERVING, new requests are refused with UNAVAILABLE, and the server stops once the
/// running requests finished. A service exists only once the verifier has answered, so
/// health reports SERVING from the start.
pub async fn serve(
    service: GenerationService,
    incoming: TcpIncoming,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let services = [SpecdService::Generation];
    let (health, health_service) = HealthState::starting(&services).await;
    let reflection = reflection_service(&services)?;
    let limits = service.config().limits;
    let draining = service.clone();
    let generation = GenerationServer::new(service).with_message_limits(&limits);
    let health_on_drain = health.clone();
    let drained = async move {
        shutdown.await;
        draining.start_drain();
        health_on_drain.set_not_serving().await;
        info!("draining: refusing new requests, finishing running ones");
        draining.drained().await;
        info!("drained");
    };
    health.set_serving().await;
    Server::builder()
        // One server span per call, continuing the caller's trace.
        .trace_fn(specd_telemetry::propagation::server_span)
        .add_service(health_service)
        .add_service(reflection)
        .add_service(generation)
        // Small per-round messages must not wait for delayed ACKs.
        .serve_with_incoming_shutdown(incoming.with_nodelay(Some(true)), drained)
        .await?;
    Ok(())
}
