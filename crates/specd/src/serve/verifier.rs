//! `specd serve verifier`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use specd_verifier::server::{serve, VerifierServerConfig, VerifierService};
use specd_verifier::{BatchConfig, KvBudget, LocalVerifier, TargetModel, VerifierLimits};

use super::listen::{bind, shutdown_signal};
use super::ServiceArgs;
use crate::checkpoints::LoadedTarget;
use crate::device::ComputeArgs;

#[derive(Args, Debug)]
pub struct VerifierArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "SPECD_LISTEN", default_value = "0.0.0.0:50051")]
    pub listen: SocketAddr,
    /// Target: a checkpoint directory (config.json, safetensors) or a GGUF file of a family
    /// the registry knows (Llama-style decoders, Gemma 4).
    #[arg(long, env = "SPECD_TARGET")]
    pub target: PathBuf,
    #[command(flatten)]
    pub sequences: SequenceArgs,
    /// Seconds after which an untouched sequence is released (0: never).
    #[arg(long, env = "SPECD_IDLE_TIMEOUT_SECS", default_value_t = 600)]
    pub idle_timeout_secs: u64,
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub compute: ComputeArgs,
}

/// How the target holds and batches its sequences, shared by the verifier and the
/// one-process server.
#[derive(Args, Debug)]
pub struct SequenceArgs {
    /// Live sequences at most; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "SPECD_MAX_SEQUENCES", default_value_t = 256)]
    pub max_sequences: usize,
    /// K/V positions all sequences may reserve together (prompt + max_new_tokens + rollback
    /// slack each); a prefill over it is refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "SPECD_MAX_KV_TOKENS")]
    pub max_kv_tokens: Option<usize>,
    /// K/V bytes all sequences may reserve together (worst case each).
    #[arg(long, env = "SPECD_MAX_KV_BYTES")]
    pub max_kv_bytes: Option<usize>,
    /// Bytes of K/V kept after sequences finish (and at prompt chunk boundaries), so that
    /// a later prompt sharing their start prefills only the rest (multi-turn chats, agent
    /// loops, retries). Counted inside --max-kv-bytes: admission evicts cached prefixes
    /// before it refuses a sequence. Default: half of --max-kv-bytes, or 2 GiB without it;
    /// 0 switches the prefix cache off.
    #[arg(long, env = "SPECD_PREFIX_CACHE_BYTES")]
    pub prefix_cache_bytes: Option<usize>,
    /// Sequences one batched verify forward runs at most.
    #[arg(long, env = "SPECD_BATCH_MAX_ROWS", default_value_t = 16)]
    pub batch_max_rows: usize,
    /// Microseconds the first waiting verify row waits for others to share its forward.
    #[arg(long, env = "SPECD_BATCH_MAX_WAIT_US", default_value_t = 1000)]
    pub batch_max_wait_us: u64,
}

impl SequenceArgs {
    /// The verifier of `target` with these limits and its prefix cache.
    pub fn local<T: TargetModel>(&self, target: T) -> LocalVerifier<T> {
        let prefix_cache = prefix_cache_bytes(self.prefix_cache_bytes, self.max_kv_bytes);
        let unbounded = |limit: Option<usize>| limit.map_or("unbounded".into(), |n| n.to_string());
        // What an operator checks a deployment's settings against.
        tracing::info!(
            max_sequences = self.max_sequences,
            max_kv_tokens = %unbounded(self.max_kv_tokens),
            max_kv_bytes = %unbounded(self.max_kv_bytes),
            prefix_cache_bytes = prefix_cache,
            batch_max_rows = self.batch_max_rows.max(1),
            batch_max_wait_us = self.batch_max_wait_us,
            "verifier limits"
        );
        LocalVerifier::new(
            Arc::new(target),
            VerifierLimits {
                max_sequences: self.max_sequences,
            },
        )
        .with_kv_budget(KvBudget {
            max_tokens: self.max_kv_tokens,
            max_bytes: self.max_kv_bytes,
        })
        .with_prefix_cache(prefix_cache)
    }

    pub fn batch(&self) -> BatchConfig {
        BatchConfig {
            max_rows: self.batch_max_rows.max(1),
            max_wait: Duration::from_micros(self.batch_max_wait_us),
        }
    }
}

pub async fn run(args: VerifierArgs) -> Result<()> {
    let target = LoadedTarget::load(&args.target, &args.compute)?;
    serve_target(target.model, &args).await
}

async fn serve_target<T: TargetModel>(target: T, args: &VerifierArgs) -> Result<()> {
    let local = args.sequences.local(target);
    let config = VerifierServerConfig {
        limits: args.service.limits.limits()?,
        idle_timeout: (args.idle_timeout_secs > 0)
            .then(|| Duration::from_secs(args.idle_timeout_secs)),
        model_name: dir_name(&args.target),
        batch: args.sequences.batch(),
        serving: args.service.listener.options()?,
    };
    let service = VerifierService::new(Arc::new(local), config);
    let incoming = bind(args.listen, "verifier")?;
    serve(service, incoming, shutdown_signal()).await?;
    Ok(())
}

/// Prefix-cache bytes when none are given: a cached prefix that only evictions keep from
/// growing into the whole K/V budget would make admission evict on every request.
pub const DEFAULT_PREFIX_CACHE_BYTES: usize = 2 << 30;

/// The prefix cache's bound: as given, else half the K/V budget, else the default.
pub fn prefix_cache_bytes(given: Option<usize>, max_kv_bytes: Option<usize>) -> usize {
    given.unwrap_or_else(|| max_kv_bytes.map_or(DEFAULT_PREFIX_CACHE_BYTES, |b| b / 2))
}

/// The checkpoint's directory name, which identifies the model in Stats.
pub fn dir_name(dir: &std::path::Path) -> String {
    dir.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}
