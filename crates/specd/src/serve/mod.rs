//! `specd serve verifier|drafter|router`: run one service on a socket, with gRPC health and
//! reflection, until SIGINT or SIGTERM; `specd serve` with no service name runs all three
//! in one process.

mod announced_drafter;
mod drafter;
mod engine;
mod listen;
mod one_process;
mod router;
mod telemetry;
mod verifier;

pub use telemetry::{init_telemetry, TelemetryArgs};

use anyhow::Result;
use clap::{Args, Subcommand};
use specd_wire::limits::{MessageLimits, DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_SNAPSHOT_CHUNK_BYTES};

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct ServeArgs {
    /// The service to run; without one, router, verifier and drafter run in this process.
    #[command(subcommand)]
    service: Option<Service>,
    #[command(flatten)]
    one_process: Box<one_process::OneProcessArgs>,
    /// Compute threads of the service's model (default: one per available core), so that
    /// services sharing a machine can each be given their cores.
    #[arg(long, global = true, env = "SPECD_THREADS")]
    threads: Option<usize>,
}

#[derive(Subcommand, Debug)]
enum Service {
    /// The target model: sequences, verify rounds, K/V snapshots (specd.v1.Verifier).
    Verifier(verifier::VerifierArgs),
    /// A drafter: a Gemma 4 assistant (mtp) or a GGUF draft model (specd.v1.Drafter).
    Drafter(drafter::DrafterArgs),
    /// The public API: one round loop per request over a verifier and drafters
    /// (specd.v1.Generation).
    Router(Box<router::RouterArgs>),
}

/// What every service's command line has: message limits, its listener (TLS, API keys)
/// and its telemetry.
#[derive(Args, Debug)]
pub struct ServiceArgs {
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub listener: listen::ListenerArgs,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

/// Message limits every service applies to both directions.
#[derive(Args, Debug, Clone)]
pub struct LimitArgs {
    /// Largest gRPC message sent or received, in bytes.
    #[arg(long, env = "SPECD_MAX_MESSAGE_BYTES", default_value_t = DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,
    /// Largest K/V snapshot chunk payload, in bytes.
    #[arg(long, env = "SPECD_SNAPSHOT_CHUNK_BYTES", default_value_t = DEFAULT_SNAPSHOT_CHUNK_BYTES)]
    pub snapshot_chunk_bytes: usize,
}

impl LimitArgs {
    pub fn limits(&self) -> Result<MessageLimits> {
        Ok(MessageLimits::new(
            self.max_message_bytes,
            self.snapshot_chunk_bytes,
        )?)
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    if let Some(threads) = args.threads {
        if threads == 0 {
            anyhow::bail!("--threads: must be at least 1");
        }
        // Read once, by the compute pool (and candle's) when the model first runs; set
        // before any other thread exists.
        std::env::set_var(specd_models::cpu::THREADS_ENV, threads.to_string());
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match args.service {
            Some(Service::Verifier(args)) => verifier::run(args).await,
            Some(Service::Drafter(args)) => drafter::run(args).await,
            Some(Service::Router(args)) => router::run(*args).await,
            None => one_process::run(*args.one_process).await,
        }
    })
}
