//! Binding the listening socket and waiting for a shutdown signal.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use tonic::transport::server::TcpIncoming;
use tracing::info;

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
