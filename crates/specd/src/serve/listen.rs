//! Binding the listening socket and waiting for a shutdown signal.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use specd_wire::serving::ServeOptions;
use specd_wire::tls::ServerTls;
use tonic::transport::server::TcpIncoming;
use tracing::info;

/// How every service's listener serves connections.
#[derive(Args, Debug, Clone)]
pub struct ListenerArgs {
    /// Serve TLS with this PEM certificate chain (with --tls-key).
    #[arg(long, env = "SPECD_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "SPECD_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this PEM CA (mutual TLS); needs --tls-cert.
    #[arg(long, env = "SPECD_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Do not serve gRPC server reflection.
    #[arg(long, env = "SPECD_NO_REFLECTION")]
    pub no_reflection: bool,
    /// Seconds between HTTP/2 keepalive pings on each connection, so calls of a peer that
    /// vanished end (0: no pings).
    #[arg(long, env = "SPECD_HTTP2_KEEPALIVE_SECS", default_value_t = 30)]
    pub http2_keepalive_secs: u64,
    /// Streams one connection may have open at once.
    #[arg(long, env = "SPECD_MAX_STREAMS_PER_CONNECTION", default_value_t = 256)]
    pub max_streams_per_connection: u32,
}

impl ListenerArgs {
    /// The listener's options, with its TLS files read and checked.
    pub fn options(&self) -> Result<ServeOptions> {
        let tls = ServerTls::from_files(
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            self.tls_client_ca.as_deref(),
        )?;
        if self.max_streams_per_connection == 0 {
            anyhow::bail!("--max-streams-per-connection: must be at least 1");
        }
        Ok(ServeOptions {
            tls,
            reflection: !self.no_reflection,
            keepalive: (self.http2_keepalive_secs > 0)
                .then(|| Duration::from_secs(self.http2_keepalive_secs)),
            max_concurrent_streams: self.max_streams_per_connection,
            ..ServeOptions::default()
        })
    }
}

/// Binds `addr` and announces the bound address on stdout (`listening on 127.0.0.1:PORT`),
/// which is how a supervisor or test learns the port when `addr` asks for port 0.
pub fn bind(addr: SocketAddr, service: &str) -> Result<TcpIncoming> {
    let incoming =
        TcpIncoming::bind(addr).with_context(|| format!("binding the {service} to {addr}"))?;
    let bound = incoming.local_addr().context("reading the bound address")?;
    info!(%bound, service, "listening");
    println!("listening on {bound}");
    Ok(incoming)
}

/// Binds the HTTP API's address and announces it on stdout (`http listening on ADDR`),
/// before the gRPC address.
pub async fn bind_http(addr: SocketAddr) -> Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the HTTP API to {addr}"))?;
    let bound = listener.local_addr().context("reading the bound address")?;
    info!(%bound, service = "router-http", "listening");
    println!("http listening on {bound}");
    Ok(listener)
}

/// Resolves on SIGINT or SIGTERM, so a server drains its connections before exiting.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = interrupt => {}
            () = terminate => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
    info!("shutting down");
}
