//! What a process asks of telemetry.

use std::net::SocketAddr;

/// Where traces and metrics go; everything off gives plain logging.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// `service.name` of exported spans.
    pub service_name: String,
    /// OTLP/gRPC collector, e.g. `http://otel-collector:4317`.
    pub otlp_endpoint: Option<String>,
    /// Address of the Prometheus endpoint (port 0 picks a free port).
    pub metrics_listen: Option<SocketAddr>,
}

impl TelemetryConfig {
    /// Logging only, for commands without telemetry flags.
    pub fn logging_only(service_name: impl Into<String>) -> Self {
        Self {
            service_name: service_name.into(),
            otlp_endpoint: None,
            metrics_listen: None,
        }
    }
}
