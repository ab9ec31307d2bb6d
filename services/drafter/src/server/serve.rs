//! A drafter server on a listening socket: the Drafter service, health and reflection.

use std::future::Future;
use std::sync::Arc;

use specd_wire::descriptor::SpecdService;
use specd_wire::drafter::DrafterServer;
use specd_wire::limits::WithMessageLimits;
pub use specd_wire::serving::ServeError;
use specd_wire::serving::{serve_work, WorkDrain};
use tonic::transport::server::TcpIncoming;

use super::service::DrafterService;
use crate::engine::DraftEngine;
use specd_wire::idle::expire_idle;

/// Serves `service` on `incoming` until `shutdown` resolves, then drains: health turns
/// NOT_SERVING, Open answers UNAVAILABLE, and the server stops once no session is open
/// (drafts of running requests go on until then; idle sessions expire through the reaper,
/// so this ends even if a router vanished). The engine is loaded by the time a service
/// exists, so health reports SERVING from the start.
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
    let drain = WorkDrain {
        refuse: &["Open"],
        live: move || sessions.len(),
        what: "refusing new sessions, serving open ones",
    };
    serve_work(
        SpecdService::Drafter,
        &options,
        DrafterServer::new(service).with_message_limits(&limits),
        incoming,
        // One server span per call, continuing the caller's trace.
        specd_telemetry::propagation::server_span,
        shutdown,
        drain,
    )
    .await
}
