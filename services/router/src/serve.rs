//! A router server on a listening socket: the Generation service, health and reflection.

use std::future::Future;

use specd_wire::descriptor::SpecdService;
use specd_wire::generation::GenerationServer;
use specd_wire::limits::WithMessageLimits;
pub use specd_wire::serving::ServeError;
use specd_wire::serving::{serve_draining, Drain};
use tonic::transport::server::TcpIncoming;

use crate::service::GenerationService;

/// Serves `service` on `incoming` until `shutdown` resolves, then drains: health turns
/// NOT_SERVING, new requests are refused with UNAVAILABLE, and the server stops once the
/// running requests finished. Until then health follows the verifiers: SERVING while one
/// answers, NOT_SERVING while none does.
pub async fn serve(
    service: GenerationService,
    incoming: TcpIncoming,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let limits = service.config().limits;
    let options = service.config().serving.clone();
    let available = service.verifier_reachable();
    let draining = service.clone();
    let finishing = service.clone();
    let generation = GenerationServer::new(service).with_message_limits(&limits);
    let drain = Drain {
        begin: move || draining.start_drain(),
        finished: async move { finishing.drained().await },
        what: "refusing new requests, finishing running ones",
    };
    serve_draining(
        SpecdService::Generation,
        &options,
        generation,
        incoming,
        // One server span per call, continuing the caller's trace.
        specd_telemetry::propagation::server_span,
        shutdown,
        drain,
        Some(available),
    )
    .await
}
