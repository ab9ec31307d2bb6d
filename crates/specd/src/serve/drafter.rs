//! `specd serve drafter`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use specd_drafter::{
    serve, DraftEngine, DraftModelEngine, DrafterServerConfig, DrafterService, MtpEngine,
};
use specd_models::{LoadSpec, MatrixPrecision, ModelSource};

use super::listen::{bind, shutdown_signal};
use super::ServiceArgs;
use crate::checkpoints::{detect, drafter_checkpoint};
use crate::device::ComputeArgs;
use crate::draft_weights::DraftWeights;
use crate::generate::EmbeddedDraft;

#[derive(Args, Debug)]
pub struct DrafterArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "SPECD_LISTEN", default_value = "0.0.0.0:50052")]
    pub listen: SocketAddr,
    /// Drafter: an MTP assistant (a Gemma 4 assistant: a checkpoint directory of model_type
    /// gemma4_assistant or a `gemma4-assistant` GGUF file; the mtp kind), or a causal LM that
    /// drafts as an independent draft model (a Llama-style GGUF file; the draft-model kind).
    #[arg(long, env = "SPECD_DRAFTER")]
    pub drafter: PathBuf,
    /// Target: for an assistant, the checkpoint directory or GGUF file whose token embedding
    /// table is read (memory-mapped); for a draft model, the target checkpoint, whose
    /// vocabulary the drafter's must equal (only its metadata is read).
    #[arg(long, env = "SPECD_TARGET")]
    pub target: PathBuf,
    /// Open sessions at most; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "SPECD_MAX_SESSIONS", default_value_t = 256)]
    pub max_sessions: usize,
    /// Seconds after which an untouched session is closed (0: never).
    #[arg(long, env = "SPECD_IDLE_TIMEOUT_SECS", default_value_t = 600)]
    pub idle_timeout_secs: u64,
    /// Opens (snapshot or context upload and the session's prefill) in progress at once;
    /// more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "SPECD_MAX_CONCURRENT_OPENS", default_value_t = 8)]
    pub max_concurrent_opens: usize,
    /// Seconds an Open may take from its first message to a ready session.
    #[arg(long, env = "SPECD_OPEN_TIMEOUT_SECS", default_value_t = 60)]
    pub open_timeout_secs: u64,
    /// K/V positions all sessions may hold together; an Open or draft past it is refused
    /// with RESOURCE_EXHAUSTED (the router then decodes that request without drafts).
    #[arg(long, env = "SPECD_MAX_KV_TOKENS")]
    pub max_kv_tokens: Option<usize>,
    /// A GGUF draft model proposes only token ids below this (its LM head reads only their
    /// rows); 0: the whole vocabulary.
    #[arg(long, env = "SPECD_DRAFT_VOCAB", default_value_t = specd_drafter::DEFAULT_DRAFT_VOCAB)]
    pub draft_vocab: usize,
    /// The precision a GGUF draft model's matrices run in on CPU: `q4` re-encodes those
    /// stored wider than 4.5 bits a weight at load, so each draft step streams fewer bytes
    /// (the output is the target's either way).
    #[arg(long, env = "SPECD_DRAFT_WEIGHTS", value_enum, default_value_t = DraftWeights::default())]
    pub draft_weights: DraftWeights,
    /// A GGUF draft model keeps this many bytes of closed sessions' K/V, so that a session
    /// whose context starts the same way (a conversation's next turn) prefills only the
    /// rest; 0 switches it off. Sessions use it only within their request's scope.
    #[arg(long, env = "SPECD_PREFIX_CACHE_BYTES", default_value_t = DEFAULT_DRAFTER_PREFIX_CACHE_BYTES)]
    pub prefix_cache_bytes: usize,
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub compute: ComputeArgs,
}

/// The draft model's prefix cache when none is given: about 40,000 positions of the 0.5B
/// drafter's f32 K/V.
pub const DEFAULT_DRAFTER_PREFIX_CACHE_BYTES: usize = 1 << 30;

/// Largest Draft count a draft-model drafter serves.
const DRAFT_MODEL_MAX_DRAFT_TOKENS: usize = 16;

pub async fn run(args: DrafterArgs) -> Result<()> {
    let device = args.compute.device()?;
    let spec = LoadSpec {
        device: &device,
        dtype: args.compute.dtype(),
        precision: MatrixPrecision::Stored,
    };
    let loading = || format!("loading the drafter from {}", args.drafter.display());
    let (source, kind) = drafter_checkpoint(&args.drafter)?;
    match kind {
        EmbeddedDraft::Mtp => {
            let engine = MtpEngine::load(&args.drafter, &args.target, spec.dtype, &device)
                .with_context(loading)?;
            serve_engine(engine, &args).await
        }
        _ => {
            // Checked on the metadata first, so a wrong pair fails before any weight is loaded.
            let target_vocab = vocab_size(&detect(&args.target, "target")?, "target")?;
            let vocab = vocab_size(&source, "drafter")?;
            if vocab != target_vocab {
                bail!(
                    "drafter {}: its vocabulary has {vocab} tokens, the target {} has \
                     {target_vocab}; a draft model must share the target's vocabulary",
                    args.drafter.display(),
                    args.target.display()
                );
            }
            let spec = LoadSpec {
                precision: args.draft_weights.into(),
                ..spec
            };
            let engine = DraftModelEngine::load(&source, &spec, DRAFT_MODEL_MAX_DRAFT_TOKENS)
                .with_context(loading)?
                .with_draft_vocab(args.draft_vocab)
                .with_prefix_cache(args.prefix_cache_bytes);
            serve_engine(engine, &args).await
        }
    }
}

/// The vocabulary size a checkpoint declares (`role` names it in errors), read from its
/// metadata.
fn vocab_size(source: &ModelSource, role: &str) -> Result<usize> {
    source
        .vocab_size()
        .with_context(|| format!("reading the {role} {}", source.path().display()))
}

async fn serve_engine<E: DraftEngine>(engine: E, args: &DrafterArgs) -> Result<()> {
    let config = DrafterServerConfig {
        limits: args.service.limits.limits()?,
        max_sessions: args.max_sessions,
        idle_timeout: (args.idle_timeout_secs > 0)
            .then(|| Duration::from_secs(args.idle_timeout_secs)),
        max_concurrent_opens: args.max_concurrent_opens.max(1),
        open_timeout: Duration::from_secs(args.open_timeout_secs.max(1)),
        max_kv_tokens: args.max_kv_tokens,
        serving: args.service.listener.options()?,
        ..DrafterServerConfig::default()
    };
    let service = DrafterService::new(Arc::new(engine), config)?;
    let incoming = bind(args.listen, "drafter")?;
    serve(service, incoming, shutdown_signal()).await?;
    Ok(())
}
