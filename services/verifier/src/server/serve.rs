//! A verifier server on a listening socket: the Verifier service, health and reflection.

use std::future::Future;
use std::sync::Arc;

use specd_wire::descriptor::{reflection_service, ReflectionError, SpecdService};
use specd_wire::health::HealthState;
use specd_wire::limits::WithMessageLimits;
use specd_wire::verifier::VerifierServer;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

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

/// Serves `service` on `incoming` until `shutdown` resolves. The target is loaded by the
/// time a service exists, so health reports SERVING from the start.
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
    let verifier = VerifierServer::new(service).with_message_limits(&limits);
    health.set_serving().await;
    Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(verifier)
        // Small per-round messages must not wait for delayed ACKs.
        .serve_with_incoming_shutdown(incoming.with_nodelay(Some(true)), shutdown)
        .await?;
    Ok(())
}
