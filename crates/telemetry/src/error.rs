//! Why telemetry could not start.

use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("telemetry runtime: {0}")]
    Runtime(std::io::Error),
    #[error("otlp endpoint {endpoint}: {reason}")]
    Exporter { endpoint: String, reason: String },
    #[error("a tracing subscriber is already installed: {0}")]
    Subscriber(String),
    #[error("metrics recorder: {0}")]
    Recorder(String),
    #[error("metrics listen {addr}: {source}")]
    MetricsListen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}
