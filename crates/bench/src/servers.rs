//! The real verifier, drafter and router servers, started in this process on 127.0.0.1:0,
//! and a loopback proxy that counts the bytes each link carries.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use specd_drafter::{DraftEngine, DrafterServerConfig, DrafterService};
use specd_router::{DraftSource, GenerationService, RouterConfig, TargetText, VerifierSource};
use specd_verifier::server::{VerifierServerConfig, VerifierService};
use specd_verifier::{LocalVerifier, TargetModel};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::TcpIncoming;

fn loopback() -> Result<(TcpIncoming, String)> {
    let incoming = TcpIncoming::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .context("binding a loopback port")?;
    let addr = incoming.local_addr().context("reading the bound address")?;
    Ok((incoming, format!("http://{addr}")))
}

/// Serves until the process exits (the benchmark's runtime ends with it).
pub fn verifier<T: TargetModel>(local: Arc<LocalVerifier<T>>) -> Result<String> {
    let (incoming, url) = loopback()?;
    let service = VerifierService::new(local, VerifierServerConfig::default());
    tokio::spawn(async move {
        if let Err(error) =
            specd_verifier::server::serve(service, incoming, std::future::pending()).await
        {
            tracing::error!(%error, "benchmark verifier stopped");
        }
    });
    Ok(url)
}

pub fn drafter<E: DraftEngine>(engine: Arc<E>) -> Result<String> {
    let (incoming, url) = loopback()?;
    let service = DrafterService::new(engine, DrafterServerConfig::default())?;
    tokio::spawn(async move {
        if let Err(error) = specd_drafter::serve(service, incoming, std::future::pending()).await {
            tracing::error!(%error, "benchmark drafter stopped");
        }
    });
    Ok(url)
}

pub async fn router(
    verifier_url: &str,
    source: &DraftSource,
    eos_token_ids: Vec<u32>,
    block_size: usize,
) -> Result<String> {
    let config = RouterConfig {
        block_size,
        max_block_size: block_size.max(8),
        ..RouterConfig::default()
    };
    let service = GenerationService::connect(
        &VerifierSource::single(verifier_url),
        source,
        TargetText::without_tokenizer(eos_token_ids),
        config,
        Duration::from_secs(60),
    )
    .await
    .context("connecting the benchmark router")?;
    let (incoming, url) = loopback()?;
    tokio::spawn(async move {
        if let Err(error) = specd_router::serve(service, incoming, std::future::pending()).await {
            tracing::error!(%error, "benchmark router stopped");
        }
    });
    Ok(url)
}

/// Bytes a link carried so far, per direction.
#[derive(Default)]
pub struct LinkBytes {
    pub to_server: AtomicU64,
    pub to_client: AtomicU64,
}

impl LinkBytes {
    pub fn read(&self) -> (u64, u64) {
        (
            self.to_server.load(Ordering::Relaxed),
            self.to_client.load(Ordering::Relaxed),
        )
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    counter: Arc<LinkBytes>,
    to_server: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let slot = if to_server {
            &counter.to_server
        } else {
            &counter.to_client
        };
        slot.fetch_add(n as u64, Ordering::Relaxed);
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// A TCP proxy in front of `upstream` (an `http://host:port` URL) that counts every byte
/// of HTTP/2 traffic through it: the real on-wire size, gRPC and HTTP/2 framing included.
pub async fn counting_proxy(upstream: &str) -> Result<(String, Arc<LinkBytes>)> {
    let target = upstream.trim_start_matches("http://").to_owned();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let counter = Arc::new(LinkBytes::default());
    let counts = counter.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(&target).await else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::spawn(pump(client_read, server_write, counts.clone(), true));
            tokio::spawn(pump(server_read, client_write, counts.clone(), false));
        }
    });
    Ok((url, counter))
}
