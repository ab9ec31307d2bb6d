//! `specd serve verifier`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use specd_verifier::server::{serve, VerifierServerConfig, VerifierService};
use specd_verifier::{Gemma4Target, LocalVerifier, VerifierLimits};

use super::listen::{bind, shutdown_signal};
use super::LimitArgs;
use crate::device::{DTypeArg, DeviceArg};

#[derive(Args, Debug)]
pub struct VerifierArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "SPECD_LISTEN", default_value = "0.0.0.0:50051")]
    pub listen: SocketAddr,
    /// Target checkpoint directory (config.json, safetensors).
    #[arg(long, env = "SPECD_TARGET")]
    pub target: PathBuf,
    /// Live sequences at most; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "SPECD_MAX_SEQUENCES", default_value_t = 256)]
    pub max_sequences: usize,
    /// Seconds after which an untouched sequence is released (0: never).
    #[arg(long, env = "SPECD_IDLE_TIMEOUT_SECS", default_value_t = 600)]
    pub idle_timeout_secs: u64,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceArg,
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DTypeArg,
}

pub async fn run(args: VerifierArgs) -> Result<()> {
    let device = args.device.device()?;
    let target = Gemma4Target::load(&args.target, args.dtype.dtype(), &device)
        .with_context(|| format!("loading the target from {}", args.target.display()))?;
    let local = LocalVerifier::new(
        Arc::new(target),
        VerifierLimits {
            max_sequences: args.max_sequences,
        },
    );
    let config = VerifierServerConfig {
        limits: args.limits.limits()?,
        idle_timeout: (args.idle_timeout_secs > 0)
            .then(|| Duration::from_secs(args.idle_timeout_secs)),
        model_name: dir_name(&args.target),
    };
    let service = VerifierService::new(Arc::new(local), config);
    let incoming = bind(args.listen, "verifier")?;
    serve(service, incoming, shutdown_signal()).await?;
    Ok(())
}

/// The checkpoint's directory name, which identifies the model in Stats.
pub fn dir_name(dir: &std::path::Path) -> String {
    dir.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}
