//! Process-wide setup and shutdown of logging, tracing export and metrics.

use std::net::SocketAddr;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tokio::runtime::Runtime;
use tracing_subscriber::filter::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::config::TelemetryConfig;
use crate::error::TelemetryError;
use crate::metrics_http;

/// Spans exported by default: specd's own at info level (round, draft, verify, rpc spans);
/// the transport crates' spans would only add noise.
const DEFAULT_TRACE_FILTER: &str = "specd=info";

/// Telemetry of this process; call [`Telemetry::shutdown`] before exit to flush spans.
pub struct Telemetry {
    runtime: Option<Runtime>,
    provider: Option<SdkTracerProvider>,
    metrics_addr: Option<SocketAddr>,
}

impl Telemetry {
    /// Where the Prometheus endpoint listens, when one was asked for.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Exports the spans still buffered, then stops the exporter and the metrics endpoint.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(error) = provider.shutdown() {
                eprintln!("flushing traces failed: {error}");
            }
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Installs the subscriber, the W3C propagator, and (as configured) the OTLP exporter and
/// the metrics endpoint. Call once per process, outside any async runtime.
pub fn init(config: &TelemetryConfig) -> Result<Telemetry, TelemetryError> {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let needs_runtime = config.otlp_endpoint.is_some() || config.metrics_listen.is_some();
    let runtime = if needs_runtime {
        Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("telemetry")
                .enable_all()
                .build()
                .map_err(TelemetryError::Runtime)?,
        )
    } else {
        None
    };
    let provider = match (&config.otlp_endpoint, &runtime) {
        (Some(endpoint), Some(runtime)) => {
            Some(tracer_provider(endpoint, &config.service_name, runtime)?)
        }
        _ => None,
    };
    install_subscriber(provider.as_ref())?;
    let metrics_addr = match (config.metrics_listen, &runtime) {
        (Some(addr), Some(runtime)) => Some(metrics_http::start(addr, runtime)?),
        _ => None,
    };
    Ok(Telemetry {
        runtime,
        provider,
        metrics_addr,
    })
}

/// The exporter's gRPC channel lives on `runtime`; the SDK's batch processor runs on its own
/// thread and hands batches to that channel.
fn tracer_provider(
    endpoint: &str,
    service_name: &str,
    runtime: &Runtime,
) -> Result<SdkTracerProvider, TelemetryError> {
    let _entered = runtime.enter();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| TelemetryError::Exporter {
            endpoint: endpoint.to_owned(),
            reason: e.to_string(),
        })?;
    let resource = Resource::builder()
        .with_service_name(service_name.to_owned())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

fn install_subscriber(provider: Option<&SdkTracerProvider>) -> Result<(), TelemetryError> {
    let log_filter = EnvFilter::try_from_env("SPECD_LOG").unwrap_or_else(|_| "warn".into());
    // Colours only on a terminal: a container's or a journal's log keeps plain text.
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(log_filter);
    let traces = provider.map(|provider| {
        let trace_filter =
            EnvFilter::try_from_env("SPECD_TRACE").unwrap_or_else(|_| DEFAULT_TRACE_FILTER.into());
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("specd"))
            .with_filter(trace_filter)
    });
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init()
        .map_err(|e| TelemetryError::Subscriber(e.to_string()))
}
