//! A drafter server on a listening socket: the Drafter service, health and reflection.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use specd_wire::descriptor::SpecdService;
use specd_wire::drafter::DrafterServer;
use specd_wire::draining::{DrainSwitch, RefuseWhileDraining};
use specd_wire::limits::WithMessageLimits;
pub use specd_wire::serving::ServeError;
use specd_wire::serving::{serve_draining, Drain};
use tonic::transport::server::TcpIncoming;

use super::reaper::expire_idle;
use super::service::DrafterService;
use crate::engine::DraftEngine;

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
    let limits = service.config().limits;
    let options = service.config().serving.clone();
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
    let drain = Drain {
        begin: move || switch.start(),
        // Idle sessions expire through the reaper, so this ends even if a router vanished.
        finished: async move {
            while sessions.len() > 0 {
                tokio::time::sleep(DRAIN_POLL).await;
            }
        },
        what: "refusing new sessions, serving open ones",
    };
    serve_draining(
        SpecdService::Drafter,
        &options,
        drafter,
        incoming,
        // One server span per call, continuing the caller's trace.
        specd_telemetry::propagation::server_span,
        shutdown,
        drain,
        None,
    )
    .await
}
