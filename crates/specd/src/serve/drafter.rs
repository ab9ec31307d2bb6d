//! `specd serve drafter`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use specd_drafter::{serve, DrafterServerConfig, DrafterService, MtpEngine};

use super::listen::{bind, shutdown_signal};
use super::LimitArgs;
use crate::device::{DTypeArg, DeviceArg};

#[derive(Args, Debug)]
pub struct DrafterArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "SPECD_LISTEN", default_value = "0.0.0.0:50052")]
    pub listen: SocketAddr,
    /// Gemma 4 assistant checkpoint directory (model_type gemma4_assistant).
    #[arg(long, env = "SPECD_DRAFTER")]
    pub drafter: PathBuf,
    /// Target checkpoint directory; only its token embedding table is read (memory-mapped).
    #[arg(long, env = "SPECD_TARGET")]
    pub target: PathBuf,
    /// Open sessions at most; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "SPECD_MAX_SESSIONS", default_value_t = 256)]
    pub max_sessions: usize,
    /// Seconds after which an untouched session is closed (0: never).
    #[arg(long, env = "SPECD_IDLE_TIMEOUT_SECS", default_value_t = 600)]
    pub idle_timeout_secs: u64,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceArg,
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DTypeArg,
}

pub async fn run(args: DrafterArgs) -> Result<()> {
    let device = args.device.device()?;
    let engine = MtpEngine::load(&args.drafter, &args.target, args.dtype.dtype(), &device)
        .with_context(|| format!("loading the drafter from {}", args.drafter.display()))?;
    let config = DrafterServerConfig {
        limits: args.limits.limits()?,
        max_sessions: args.max_sessions,
        idle_timeout: (args.idle_timeout_secs > 0)
            .then(|| Duration::from_secs(args.idle_timeout_secs)),
        ..DrafterServerConfig::default()
    };
    let service = DrafterService::new(Arc::new(engine), config);
    let incoming = bind(args.listen, "drafter")?;
    serve(service, incoming, shutdown_signal()).await?;
    Ok(())
}
