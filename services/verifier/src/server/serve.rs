//! A verifier server on a listening socket: the Verifier service, health and reflection.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use specd_wire::descriptor::{reflection_service, ReflectionError, SpecdService};
use specd_wire::draining::{DrainSwitch, RefuseWhileDraining};
use specd_wire::health::HealthState;
use specd_wire::limits::WithMessageLimits;
use specd_wire::verifier::VerifierServer;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;
use tracing::info;

use super::reaper::expire_idle;
use super::service::VerifierService;
use crate::target::TargetModel;

/// The server could not start or failed while serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Reflection(#[from] ReflectionError),
    #[error("verifier transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// How often a draining server looks whether its last sequence is gone.
const DRAIN_POLL: Duration = Duration::from_millis(50);

/// Serves `service` on `incoming` until `shutdown` resolves, then drains: health turns
/// NOT_SERVING, Prefill answers UNAVAILABLE, and the server stops once no sequence is live
/// (the rounds of running requests go on until then). The target is loaded by the time a
/// service exists, so health reports SERVING from the start.
pub async fn serve<T: TargetModel>(
    service: VerifierService<T>,
    incoming: TcpIncoming,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let services = [SpecdService::Verifier];
    let (health, health_service) = HealthState::starting(&services).await;
    let reflection = reflection_service(&services)?;
    let limits = service.config().limits;
    if let Some(timeout) = service.config().idle_timeout {
        tokio::spawn(expire_idle(Arc::downgrade(service.sequences()), timeout));
    }
    let sequences = service.sequences().clone();
    let switch = DrainSwitch::default();
    let verifier = RefuseWhileDraining::new(
        VerifierServer::new(service).with_message_limits(&limits),
        switch.clone(),
        &["Prefill"],
    );
    let health_on_drain = health.clone();
    let drained = async move {
        shutdown.await;
        switch.start();
        health_on_drain.set_not_serving().await;
        info!("draining: refusing new sequences, serving live ones");
        // Idle sequences expire through the reaper, so this ends even if a router vanished.
        while sequences.local().sequence_count() > 0 {
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
        .add_service(verifier)
        // Small per-round messages must not wait for delayed ACKs.
        .serve_with_incoming_shutdown(incoming.with_nodelay(Some(true)), drained)
        .await?;
    Ok(())
}
