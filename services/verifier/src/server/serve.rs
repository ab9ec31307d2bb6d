//! A verifier server on a listening socket: the Verifier service, health and reflection.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use specd_wire::descriptor::SpecdService;
use specd_wire::draining::{DrainSwitch, RefuseWhileDraining};
use specd_wire::limits::WithMessageLimits;
pub use specd_wire::serving::ServeError;
use specd_wire::serving::{serve_draining, Drain};
use specd_wire::verifier::VerifierServer;
use tonic::transport::server::TcpIncoming;

use super::reaper::expire_idle;
use super::service::VerifierService;
use crate::target::TargetModel;

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
    let limits = service.config().limits;
    let options = service.config().serving.clone();
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
    let drain = Drain {
        begin: move || switch.start(),
        // Idle sequences expire through the reaper, so this ends even if a router vanished.
        finished: async move {
            while sequences.local().sequence_count() > 0 {
                tokio::time::sleep(DRAIN_POLL).await;
            }
        },
        what: "refusing new sequences, serving live ones",
    };
    serve_draining(
        SpecdService::Verifier,
        &options,
        verifier,
        incoming,
        // One server span per call, continuing the caller's trace.
        specd_telemetry::propagation::server_span,
        shutdown,
        drain,
        None,
    )
    .await
}
