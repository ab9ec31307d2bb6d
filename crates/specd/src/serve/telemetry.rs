//! Telemetry flags every `specd serve` command takes, and the process-wide setup from them.

use std::net::SocketAddr;

use anyhow::Result;
use clap::Args;
use specd_telemetry::{Telemetry, TelemetryConfig};

use super::{ServeArgs, Service};

/// Where traces and metrics go (see the README's Observability section).
#[derive(Args, Debug, Clone, Default)]
pub struct TelemetryArgs {
    /// Serve Prometheus metrics at http://ADDR/metrics (port 0 picks a free port).
    #[arg(long, env = "SPECD_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Export traces over OTLP/gRPC to this collector, e.g. http://otel-collector:4317.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// service.name of exported spans (default: specd-router, specd-verifier, specd-drafter).
    #[arg(long, env = "OTEL_SERVICE_NAME")]
    pub service_name: Option<String>,
}

impl TelemetryArgs {
    fn config(&self, default_service_name: &str) -> TelemetryConfig {
        TelemetryConfig {
            service_name: self
                .service_name
                .clone()
                .unwrap_or_else(|| default_service_name.to_owned()),
            otlp_endpoint: self.otlp_endpoint.clone().filter(|url| !url.is_empty()),
            metrics_listen: self.metrics_listen,
        }
    }
}

impl ServeArgs {
    fn telemetry_config(&self) -> TelemetryConfig {
        match &self.service {
            Some(Service::Verifier(args)) => args.service.telemetry.config("specd-verifier"),
            Some(Service::Drafter(args)) => args.service.telemetry.config("specd-drafter"),
            Some(Service::Router(args)) => args.service.telemetry.config("specd-router"),
            None => self.one_process.service.telemetry.config("specd"),
        }
    }
}

/// Installs logging, and for a serve command its trace export and metrics endpoint. The
/// endpoint's address goes to stdout as `metrics listening on ADDR` (before the service's
/// own `listening on` line).
pub fn init_telemetry(serve: Option<&ServeArgs>) -> Result<Telemetry> {
    let config = serve.map_or_else(
        || TelemetryConfig::logging_only("specd"),
        |args| args.telemetry_config(),
    );
    let telemetry = specd_telemetry::init(&config)?;
    if let Some(addr) = telemetry.metrics_addr() {
        println!("metrics listening on {addr}");
    }
    Ok(telemetry)
}
