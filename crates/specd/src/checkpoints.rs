//! `--target` and `--drafter` loaded through the model-family registry
//! ([`specd_models::family`]): the commands ask it what a checkpoint is and how it loads, and
//! never test for a family or a file format themselves.

use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use clap::ValueEnum;
use specd_models::{LoadSpec, MatrixPrecision, ModelSource};
use specd_text::TargetText;
use specd_verifier::{AnyTarget, TargetModel};

use crate::device::ComputeArgs;
use crate::generate::EmbeddedDraft;

/// What a model path holds; `role` (`target`, `drafter`) names it in the error.
pub fn detect(path: &Path, role: &str) -> Result<ModelSource> {
    ModelSource::detect(path).with_context(|| format!("loading the {role} from {}", path.display()))
}

/// A drafter checkpoint given as `--target`.
pub fn not_a_target(source: &ModelSource) -> anyhow::Error {
    anyhow::anyhow!(
        "--target {}: a {} (a drafter), not a target",
        source.path().display(),
        source.family().name
    )
}

/// A checkpoint that cannot draft given as `--drafter`.
pub fn not_a_drafter(source: &ModelSource) -> anyhow::Error {
    anyhow::anyhow!(
        "--drafter {}: a {} target checkpoint, not a drafter (an MTP assistant or a draft \
         model)",
        source.path().display(),
        source.family().name
    )
}

/// The kind of drafter a checkpoint is: an MTP assistant drafts by MTP, a causal LM whose
/// family drafts as a draft model is one; another target checkpoint is refused.
pub fn drafter_kind_of(path: &Path) -> Result<EmbeddedDraft> {
    Ok(drafter_checkpoint(path)?.1)
}

/// The `--drafter` checkpoint and the kind of drafter it is (see [`drafter_kind_of`]), told
/// from one look at the file.
pub fn drafter_checkpoint(path: &Path) -> Result<(ModelSource, EmbeddedDraft)> {
    let source = detect(path, "drafter")?;
    let kind = match source.family().lm() {
        None => EmbeddedDraft::Mtp,
        Some(lm) if lm.draft_model => EmbeddedDraft::DraftModel,
        Some(_) => return Err(not_a_drafter(&source)),
    };
    Ok((source, kind))
}

/// The loaded `--target`: its checkpoint, the verifier's model, its text side (`None`
/// where it cannot be read; without a tokenizer where it has none) and the device it runs
/// on and in, where its drafter runs too (tensors pass between them).
pub struct LoadedTarget {
    pub source: ModelSource,
    pub model: AnyTarget,
    pub text: Option<TargetText>,
    pub device: Device,
    pub dtype: DType,
}

impl LoadedTarget {
    pub fn load(path: &Path, compute: &ComputeArgs) -> Result<Self> {
        let source = detect(path, "target")?;
        let Some(family) = source.family().lm() else {
            return Err(not_a_target(&source));
        };
        let text = match family.eos {
            // The model's end-of-sequence ids are its tokenizer's: no tokenizer, no target.
            specd_models::family::EosSource::Tokenizer => Some(
                TargetText::load(path)
                    .with_context(|| format!("loading the tokenizer of {}", path.display()))?,
            ),
            specd_models::family::EosSource::Config => optional_text(path),
        };
        let device = compute.device()?;
        let dtype = compute.dtype();
        let model = AnyTarget::load(
            &source,
            &LoadSpec {
                device: &device,
                dtype,
                precision: MatrixPrecision::Stored,
            },
            text.as_ref().map(|t| t.eos_token_ids()),
        )
        .with_context(|| format!("loading the target from {}", path.display()))?;
        Ok(Self {
            source,
            model,
            text,
            device,
            dtype,
        })
    }

    /// Where and how its drafter loads: on the target's device, in its dtype.
    pub fn drafter_spec(&self) -> LoadSpec<'_> {
        LoadSpec {
            device: &self.device,
            dtype: self.dtype,
            precision: MatrixPrecision::Stored,
        }
    }

    /// Whether the target exports the K/V an MTP assistant drafts from.
    pub fn exports_kv(&self) -> bool {
        self.source.family().lm().is_some_and(|lm| lm.exports_kv)
    }

    pub fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }
}

/// The text side of a target whose model does not need it: `None` where it cannot be read
/// (token ids still work).
fn optional_text(path: &Path) -> Option<TargetText> {
    match TargetText::load(path) {
        Ok(text) => Some(text),
        Err(error) => {
            tracing::warn!(%error, "the target's tokenizer cannot be read; only token ids work");
            None
        }
    }
}

/// Refuses `--draft kind` with a `--drafter` checkpoint (at `drafter`) of another kind,
/// `found`, and an MTP assistant for a target that exports no K/V.
pub fn check_drafter(
    kind: EmbeddedDraft,
    found: EmbeddedDraft,
    drafter: &Path,
    target: &LoadedTarget,
) -> Result<()> {
    let name = |k: EmbeddedDraft| match k {
        EmbeddedDraft::Mtp => "an MTP assistant",
        _ => "a draft model",
    };
    if matches!(kind, EmbeddedDraft::Mtp | EmbeddedDraft::DraftModel) && kind != found {
        let flag = kind
            .to_possible_value()
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default();
        bail!(
            "--draft: {flag} needs {}; --drafter {} is {}",
            name(kind),
            drafter.display(),
            name(found)
        );
    }
    if found == EmbeddedDraft::Mtp && !target.exports_kv() {
        bail!(
            "--drafter {}: an MTP assistant drafts from its target's K/V; a {} target \
             exports none",
            drafter.display(),
            target.source.family().name
        );
    }
    Ok(())
}
