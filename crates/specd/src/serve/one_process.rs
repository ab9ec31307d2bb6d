//! `specd serve` with no service name: the router's gRPC and OpenAI APIs over a verifier and
//! a drafter in the same process, meeting over the in-process interfaces of embedded mode
//! (no gRPC hop, no tensor encoding between them). The llama-server equivalent:
//! `specd serve --target T.gguf --drafter D.gguf --http-listen 127.0.0.1:8000`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use specd_core::{Drafter, HybridDrafter, NgramDrafter};
use specd_router::overlap::OverlapMode;
use specd_router::{GenerationService, InProcessEngine};
use specd_text::TargetText;
use specd_verifier::batch::DraftingRounds;
use specd_verifier::{BatchVerifier, TargetCarry, TargetModel};

use super::announced_drafter::AnnouncedDrafter;
use super::drafter::DEFAULT_DRAFTER_PREFIX_CACHE_BYTES;
use super::engine::LocalEngine;
use super::router::{serve_api, ApiArgs};
use super::verifier::{dir_name, SequenceArgs};
use super::ServiceArgs;
use crate::checkpoints::{drafter_kind_of, LoadedTarget};
use crate::device::ComputeArgs;
use crate::draft_weights::DraftWeights;
use crate::generate::EmbeddedDraft;
use crate::model_drafter::{DraftModelOptions, ModelDrafter};

#[derive(Args, Debug)]
pub struct OneProcessArgs {
    /// Target: a GGUF file (Llama-style: Qwen2, Llama; or Gemma 4) or a Gemma 4 checkpoint
    /// directory;
    /// its tokenizer and chat template serve text prompts and chat messages.
    #[arg(long, required = true)]
    pub target: Option<PathBuf>,
    /// Drafter: a GGUF draft model sharing the target's vocabulary (behind prompt lookup,
    /// `hybrid`, unless --draft says `draft-model`), or a Gemma 4 assistant (directory or
    /// `gemma4-assistant` GGUF; `mtp` unless --draft says `hybrid`).
    #[arg(long)]
    pub drafter: Option<PathBuf>,
    /// `ngram` drafts by prompt lookup (no drafter model); `hybrid` puts prompt lookup in
    /// front of --drafter; `mtp` and `draft-model` name --drafter's kind.
    #[arg(long, value_enum)]
    pub draft: Option<EmbeddedDraft>,
    /// A GGUF draft model proposes only token ids below this (0: every id).
    #[arg(long, default_value_t = specd_drafter::DEFAULT_DRAFT_VOCAB)]
    pub draft_vocab: usize,
    /// The precision a GGUF draft model's matrices run in on CPU: `q4` re-encodes those
    /// stored wider than 4.5 bits a weight at load, so each draft step streams fewer bytes
    /// (the output is the target's either way).
    #[arg(long, value_enum, default_value_t = DraftWeights::default())]
    pub draft_weights: DraftWeights,
    /// Bytes of closed sessions' K/V a GGUF draft model keeps for later sessions (0: none).
    #[arg(long, default_value_t = DEFAULT_DRAFTER_PREFIX_CACHE_BYTES)]
    pub drafter_prefix_cache_bytes: usize,
    /// Address of the gRPC API (specd.v1.Generation, health, reflection).
    #[arg(long, default_value = "0.0.0.0:50050")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub sequences: SequenceArgs,
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub compute: ComputeArgs,
}

pub async fn run(args: OneProcessArgs) -> Result<()> {
    let Some(path) = args.target.clone() else {
        bail!("--target: give the target model (or name a service: verifier, drafter, router)");
    };
    let draft = drafter_kind(&args)?;
    let target = LoadedTarget::load(&path, &args.compute)?;
    let drafter = match draft {
        Some(kind @ (EmbeddedDraft::Mtp | EmbeddedDraft::DraftModel | EmbeddedDraft::Hybrid)) => {
            let options = DraftModelOptions {
                draft_vocab: args.draft_vocab,
                weights: args.draft_weights,
                prefix_cache_bytes: args.drafter_prefix_cache_bytes,
            };
            let drafter = drafter_path(&args, kind)?;
            Some(ModelDrafter::load(drafter, kind, &target, options)?.serving()?)
        }
        Some(EmbeddedDraft::Ngram) | None => None,
    };
    let LoadedTarget { model, text, .. } = target;
    let engine = match (draft, drafter) {
        (Some(EmbeddedDraft::Hybrid), Some(drafter)) => engine(
            &args,
            &path,
            model,
            Some(HybridDrafter::with_default_lookup(drafter)),
        ),
        (_, Some(drafter)) => engine(&args, &path, model, Some(drafter)),
        (Some(EmbeddedDraft::Ngram), None) => {
            engine(&args, &path, model, Some(NgramDrafter::default()))
        }
        (_, None) => engine(&args, &path, model, None::<NgramDrafter<TargetCarry>>),
    };
    // A model whose tokenizer cannot be read still serves token ids.
    let text = text.unwrap_or_else(|| TargetText::without_tokenizer(Vec::new()));
    let config = args
        .api
        .config(&args.service, OverlapMode::Off, 0, 0, None)?;
    let service = GenerationService::in_process(engine, text, config);
    serve_api(service, args.listen, &args.api).await
}

/// `--draft`, or the kind `--drafter`'s file says.
fn drafter_kind(args: &OneProcessArgs) -> Result<Option<EmbeddedDraft>> {
    Ok(match (args.draft, &args.drafter) {
        (Some(EmbeddedDraft::Ngram), Some(path)) => bail!(
            "--draft ngram drafts without a model: drop --drafter {} or use --draft hybrid",
            path.display()
        ),
        (Some(kind), _) => Some(kind),
        // Prompt lookup in front of a draft model pays on edits and quoting and costs nothing
        // elsewhere (BENCHMARKS.md), as with the router's drafter services.
        (None, Some(path)) => Some(match drafter_kind_of(path)? {
            EmbeddedDraft::DraftModel => EmbeddedDraft::Hybrid,
            kind => kind,
        }),
        (None, None) => None,
    })
}

fn drafter_path(args: &OneProcessArgs, kind: EmbeddedDraft) -> Result<&Path> {
    args.drafter.as_deref().with_context(|| {
        let name = kind
            .to_possible_value()
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default();
        format!("--drafter: --draft {name} needs a drafter model")
    })
}

/// The target behind its batch scheduler with `drafter`, the scheduler seeing its rounds
/// drafting.
fn engine<T, D>(
    args: &OneProcessArgs,
    path: &Path,
    target: T,
    drafter: Option<D>,
) -> Arc<dyn InProcessEngine>
where
    T: TargetModel,
    D: Drafter<Carry = TargetCarry> + 'static,
{
    let local = Arc::new(args.sequences.local(target));
    let drafting = DraftingRounds::default();
    let verifier = BatchVerifier::beside(
        local,
        args.sequences.batch(),
        drafter.is_some().then(|| drafting.clone()),
    );
    let drafter = drafter.map(|drafter| AnnouncedDrafter::new(drafter, drafting));
    let name = args
        .api
        .served_model_name
        .clone()
        .unwrap_or_else(|| dir_name(path));
    Arc::new(LocalEngine::new(verifier, drafter, name))
}
