//! A drafter server on a listening socket: the Drafter service, health and reflection.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use specd_wire::descriptor::{reflection_service, ReflectionError, SpecdService};
use specd_wire::drafter::DrafterServer;
use specd_wire::draining::{DrainSwitch, RefuseWhileDraining};
use specd_wire::health::HealthState;
use specd_wire::limits::WithMessageLimits;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tracing::info;

use super::reaper::expire_idle;
use super::service::DrafterService;
use crate::engine::DraftEngine;

/// The server could not start or failed while serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Reflection(#[from] ReflectionError),
    #[error("drafter transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// How often a draining server looks whether its last session is gone.
const DRAIN_POLL: Duration = Duration::from_millis(50);

/// Serves `service` on `incoming` until `shutdown` resolves, then drains: health turns
/// NOT_SERVING, Open answers UNAVAILABLE, and the server stops once no session is open
/// (drafts of running requests go on until then). The engine is loaded by the time a
/// service exists, so health reports SERVING from the start.
pub async fn serve<E: DraftEngine>(
    service: DrafterService<E>,
    incoming: TcpIncoming,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let services = [SpecdService::Drafter];
    let (health, health_service) = HealthState::starting(&services).await;
    let reflection = reflection_service(&services)?;
    let limits = service.config().limits;
    if let Some(timeout) = service.config().idle_timeout {
        tokio::spawn(expire_idle(Arc::downgrade(service.sessions()), timeout));
    }
    let sessions = service.sessions().clone();
    let switch = DrainSwitch::default();
    let drafter = RefuseWhileDraining::new(
        DrafterServer::new(service).with_message_limits(&limits),
        switch.clone(),
        &["Open"],
    );
    let health_on_drain = health.clone();
    let drained = async move {
        shutdown.await;
        switch.start();
        health_on_drain.set_not_serving().await;
        info!("draining: refusing new sessions, serving open ones");
        // Idle sessions expire through the reaper, so this ends even if a router vanished.
        while sessions.len() > 0 {
            tokio::time::sleep(DRAIN_POLL).await;
        }
        info!("drained");
    };
    health.set_serving().await;
    Server::builder()
        // One server span per call, continuing the caller's trace.
        .trace_fn(specd_telemetry::propagation::server_span)
        .add_service(health_service)
        .add_service(reflection)
        .add_service(drafter)
        // Small per-round messages must not wait for delayed ACKs.
        .serve_with_incoming_shutdown(incoming.with_nodelay(Some(true)), drained)
        .await?;
    Ok(())
}
