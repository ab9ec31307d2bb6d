//! A drafter server on a listening socket: the Drafter service, health and reflection.

use std::future::Future;

use specd_wire::descriptor::SpecdService;
use specd_wire::drafter::DrafterServer;
use specd_wire::limits::WithMessageLimits;
pub use specd_wire::serving::ServeError;
use specd_wire::serving::{serve_work, WorkDrain};
use tonic::transport::server::TcpIncoming;

use super::service::DrafterService;
use crate::engine::DraftEngine;

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
    let config = service.config();
    let (limits, options) = (config.limits, config.serving.clone());
    let drain = WorkDrain {
        refuse: &["Open"],
        work: service.sessions().clone(),
        idle_timeout: config.idle_timeout,
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
