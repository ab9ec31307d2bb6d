//! `specd health`: a grpc.health.v1 check for container health probes, so images need no
//! separate probe binary.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use specd_wire::tls::{secure_endpoint, ClientTls};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

#[derive(Args, Debug)]
pub struct HealthArgs {
    /// Server to ask, e.g. http://127.0.0.1:50051.
    #[arg(long, default_value = "http://127.0.0.1:50050")]
    pub addr: String,
    /// Service to ask about; empty means the whole server.
    #[arg(long, default_value = "")]
    pub service: String,
    /// Seconds to wait for an answer.
    #[arg(long, default_value_t = 5)]
    pub timeout_secs: u64,
    /// The CA (PEM) the server's certificate chains to, for an https:// address.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM) to present to a server that requires one (with --tls-key).
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// The name the server's certificate must carry, when --addr names it otherwise (an
    /// address the certificate does not list, e.g. one replica behind a DNS name).
    #[arg(long)]
    pub tls_server_name: Option<String>,
}

/// Succeeds when the server reports SERVING; any other answer or no answer is an error, so
/// the exit status is the probe's verdict.
pub fn run(args: HealthArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let timeout = Duration::from_secs(args.timeout_secs.max(1));
        let tls = ClientTls::from_files(
            args.tls_ca.as_deref(),
            args.tls_cert.as_deref(),
            args.tls_key.as_deref(),
            ["--tls-ca", "--tls-cert", "--tls-key"],
        )?;
        let endpoint = tonic::transport::Endpoint::from_shared(args.addr.clone())
            .with_context(|| format!("addr: {} is not a valid URL", args.addr))?;
        let channel = secure_endpoint(
            endpoint,
            tls.as_ref(),
            args.tls_server_name.as_deref(),
            "--tls-ca",
        )
        .with_context(|| format!("addr: {}", args.addr))?
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect()
        .await
        .with_context(|| format!("connecting to {}", args.addr))?;
        let answer = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: args.service.clone(),
            })
            .await
            .with_context(|| format!("health check of {:?} at {}", args.service, args.addr))?
            .into_inner();
        let status = answer.status();
        println!("{}", status.as_str_name());
        if status != ServingStatus::Serving {
            bail!("{} reports {}", args.addr, status.as_str_name());
        }
        Ok(())
    })
}
