//! The drafter `--drafter` loads in this process, whichever kind its checkpoint is: an MTP
//! assistant (fed the target's hidden state and K/V) or an independent draft model.

use std::path::Path;

use specd_core::{DraftRequest, DraftTree, Drafter, OpenRequest, Opened, SessionId};
use specd_drafter::{DraftModelEngine, EngineError, MtpEngine};
use specd_models::{AnyLm, LoadSpec};
use specd_verifier::TargetCarry;

use crate::checkpoints::{check_drafter, drafter_checkpoint, LoadedTarget};
use crate::draft_weights::DraftWeights;
use crate::embedded_drafter::EmbeddedDrafter;
use crate::generate::EmbeddedDraft;
use crate::{embedded_draft_model, embedded_mtp};

pub enum ModelDrafter {
    Mtp(EmbeddedDrafter<MtpEngine>),
    DraftModel(EmbeddedDrafter<DraftModelEngine<AnyLm>>),
}

/// How a draft model drafts: ids below `draft_vocab` only (0: every id), its matrices held
/// as `weights` says, keeping `prefix_cache_bytes` of closed sessions' K/V for later ones.
#[derive(Debug, Clone, Copy)]
pub struct DraftModelOptions {
    pub draft_vocab: usize,
    pub weights: DraftWeights,
    pub prefix_cache_bytes: usize,
}

impl ModelDrafter {
    /// Loads `drafter` for `target`, on its device and in its dtype; refused where `kind`
    /// (from `--draft`) names another kind than the checkpoint is, or the pair cannot work
    /// together.
    pub fn load(
        drafter: &Path,
        kind: EmbeddedDraft,
        target: &LoadedTarget,
        options: DraftModelOptions,
    ) -> anyhow::Result<Self> {
        use anyhow::Context;
        let (source, found) = drafter_checkpoint(drafter)?;
        check_drafter(kind, found, drafter, target)?;
        let spec = target.drafter_spec();
        let loaded = match found {
            EmbeddedDraft::Mtp => {
                embedded_mtp::load(drafter, target.source.path(), spec.dtype, spec.device)
                    .map(Self::Mtp)
            }
            _ => embedded_draft_model::load(
                &source,
                &LoadSpec {
                    precision: options.weights.into(),
                    ..spec
                },
                target.vocab_size(),
                options.draft_vocab,
                options.prefix_cache_bytes,
            )
            .map(Self::DraftModel),
        };
        loaded.with_context(|| format!("loading the drafter from {}", drafter.display()))
    }

    /// For a server: see [`EmbeddedDrafter::serving`].
    pub fn serving(self) -> std::io::Result<Self> {
        Ok(match self {
            Self::Mtp(d) => Self::Mtp(d.serving()?),
            Self::DraftModel(d) => Self::DraftModel(d.serving()?),
        })
    }
}

impl Drafter for ModelDrafter {
    type Carry = TargetCarry;
    type Error = EngineError;

    async fn open(&self, request: OpenRequest<TargetCarry>) -> Result<Opened, EngineError> {
        match self {
            Self::Mtp(d) => d.open(request).await,
            Self::DraftModel(d) => d.open(request).await,
        }
    }

    async fn draft(&self, request: DraftRequest<TargetCarry>) -> Result<Vec<u32>, EngineError> {
        match self {
            Self::Mtp(d) => d.draft(request).await,
            Self::DraftModel(d) => d.draft(request).await,
        }
    }

    async fn draft_tree(
        &self,
        request: DraftRequest<TargetCarry>,
    ) -> Result<DraftTree, EngineError> {
        match self {
            Self::Mtp(d) => d.draft_tree(request).await,
            Self::DraftModel(d) => d.draft_tree(request).await,
        }
    }

    async fn close(&self, session: SessionId) -> Result<(), EngineError> {
        match self {
            Self::Mtp(d) => d.close(session).await,
            Self::DraftModel(d) => d.close(session).await,
        }
    }

    fn close_detached(&self, session: SessionId) {
        match self {
            Self::Mtp(d) => d.close_detached(session),
            Self::DraftModel(d) => d.close_detached(session),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Self::Mtp(d) => d.kind(),
            Self::DraftModel(d) => d.kind(),
        }
    }
}
