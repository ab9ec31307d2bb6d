//! Telemetry for specd processes: one trace per request across router, drafters and verifier,
//! and Prometheus metrics.
//!
//! What it reads and offers:
//! - [`init`] installs the process-wide `tracing` subscriber: a log layer filtered by
//!   `SPECD_LOG` (default `warn`) and, when an OTLP endpoint is configured, an OpenTelemetry
//!   layer exporting `specd*` spans at info level (`SPECD_TRACE` overrides that filter) over
//!   OTLP/gRPC. The batch export interval follows `OTEL_BSP_SCHEDULE_DELAY` (milliseconds).
//! - With a metrics address it installs the `metrics` recorder and serves Prometheus text
//!   at `http://ADDR/metrics`. The metric names are in [`names`].
//! - [`propagation`] carries W3C trace context in gRPC metadata: [`propagation::traced`]
//!   on every outgoing call, [`propagation::server_span`] as the servers' `trace_fn`.
//! - [`record`] holds the service-side recording helpers.
//!
//! Exporting and the metrics endpoint run on a small runtime of their own, so they work the
//! same under any caller (including the blocking `specd generate`) and shut down last.

#![forbid(unsafe_code)]

mod config;
mod error;
mod init;
mod metrics_http;
pub mod names;
pub mod propagation;
pub mod record;

pub use config::TelemetryConfig;
pub use error::TelemetryError;
pub use init::{init, Telemetry};
