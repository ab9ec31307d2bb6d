//! The Prometheus recorder and its `/metrics` endpoint.

use std::net::SocketAddr;

use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::runtime::Runtime;

use crate::error::TelemetryError;
use crate::names;

const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Installs the global recorder and serves it on `addr`; returns the bound address.
pub(crate) fn start(addr: SocketAddr, runtime: &Runtime) -> Result<SocketAddr, TelemetryError> {
    let handle = install_recorder()?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(addr))
        .map_err(|source| TelemetryError::MetricsListen { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| TelemetryError::MetricsListen { addr, source })?;
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move {
                handle.run_upkeep();
                ([(CONTENT_TYPE, TEXT_FORMAT)], handle.render())
            }
        }),
    );
    runtime.spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::warn!(%error, "metrics endpoint stopped");
        }
    });
    Ok(bound)
}

fn install_recorder() -> Result<PrometheusHandle, TelemetryError> {
    let recorder =
        |e: metrics_exporter_prometheus::BuildError| TelemetryError::Recorder(e.to_string());
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_owned()),
            names::DURATION_BUCKETS,
        )
        .map_err(recorder)?
        .set_buckets_for_metric(
            Matcher::Full(names::BLOCK_SIZE.to_owned()),
            names::BLOCK_SIZE_BUCKETS,
        )
        .map_err(recorder)?
        .set_buckets_for_metric(
            Matcher::Full(names::VERIFY_BATCH_ROWS.to_owned()),
            names::BATCH_ROWS_BUCKETS,
        )
        .map_err(recorder)?
        .install_recorder()
        .map_err(recorder)?;
    for &(name, help) in names::HELP {
        describe(name, help);
    }
    Ok(handle)
}

/// Help text goes to whichever kind the name is; describing all three kinds is harmless
/// (only the registered kind is rendered).
fn describe(name: &'static str, help: &'static str) {
    metrics::describe_counter!(name, help);
    metrics::describe_gauge!(name, help);
    metrics::describe_histogram!(name, help);
}
