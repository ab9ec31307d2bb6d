//! A verifier server on a listening socket: the Verifier service, health and reflection.

use std::future::Future;

use specd_wire::descriptor::SpecdService;
use specd_wire::limits::WithMessageLimits;
pub use specd_wire::serving::ServeError;
use specd_wire::serving::{serve_work, WorkDrain};
use specd_wire::verifier::VerifierServer;
use tonic::transport::server::TcpIncoming;

use super::service::VerifierService;
use crate::target::TargetModel;

/// Serves `service` on `incoming` until `shutdown` resolves, then drains: health turns
/// NOT_SERVING, Prefill answers UNAVAILABLE, and the server stops once no sequence is live
/// (the rounds of running requests go on until then; idle sequences expire through the
/// reaper, so this ends even if a router vanished). The target is loaded by the time a
/// service exists, so health reports SERVING from the start.
pub async fn serve<T: TargetModel>(
    service: VerifierService<T>,
    incoming: TcpIncoming,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let config = service.config();
    let (limits, options) = (config.limits, config.serving.clone());
    let drain = WorkDrain {
        refuse: &["Prefill"],
        work: service.sequences().clone(),
        idle_timeout: config.idle_timeout,
        what: "refusing new sequences, serving live ones",
    };
    serve_work(
        SpecdService::Verifier,
        &options,
        VerifierServer::new(service).with_message_limits(&limits),
        incoming,
        // One server span per call, continuing the caller's trace.
        specd_telemetry::propagation::server_span,
        shutdown,
        drain,
    )
    .await
}
