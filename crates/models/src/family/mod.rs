//! The model families the crate runs, one entry each: how a checkpoint of the family is
//! recognised (a directory's `config.json` `model_type`, a GGUF file's
//! `general.architecture`), what its checkpoints are (a causal LM, or an MTP assistant), and
//! how a causal LM of it is loaded. Services and the CLI ask this registry and never test
//! for a family or a format; adding a family is its folder plus one line in [`FAMILIES`], or,
//! for a program embedding specd, one [`register`] call before it loads a checkpoint.

mod any_lm;

use std::path::Path;
use std::sync::RwLock;

use candle_core::{DType, Device};

pub use any_lm::{AnyCache, AnyLm};

use crate::error::{ModelError, Result};
use crate::precision::MatrixPrecision;

/// One family the crate runs.
#[derive(Debug)]
pub struct Family {
    /// Its name in messages.
    pub name: &'static str,
    /// The `model_type` values of its checkpoint directories' `config.json`.
    pub model_types: &'static [&'static str],
    /// The `general.architecture` values of its GGUF files.
    pub gguf_architectures: fn() -> Vec<&'static str>,
    /// What its checkpoints are.
    pub role: Role,
}

/// What a family's checkpoints are.
#[derive(Debug)]
pub enum Role {
    /// A causal LM: a target, and a draft model where [`LmFamily::draft_model`] says so.
    CausalLm(LmFamily),
    /// A multi-token-prediction assistant: it drafts from the hidden state and K/V of a
    /// target whose family exports them ([`LmFamily::exports_kv`]), never alone.
    MtpAssistant,
}

/// How a causal LM family loads and what it offers.
#[derive(Debug)]
pub struct LmFamily {
    pub load: fn(&Path, &LoadSpec<'_>) -> Result<LoadedLm>,
    /// Where its end-of-sequence ids come from.
    pub eos: EosSource,
    /// Whether its caches export the K/V an MTP assistant reads.
    pub exports_kv: bool,
    /// Whether its checkpoints draft as an independent draft model (for a target with the
    /// same vocabulary).
    pub draft_model: bool,
}

/// Where a family's end-of-sequence ids are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EosSource {
    /// The checkpoint's model config ([`LoadedLm::eos_token_ids`]).
    Config,
    /// The checkpoint's tokenizer: the text side must load, and its ids are the model's.
    Tokenizer,
}

/// Where and how a model is loaded.
#[derive(Debug, Clone, Copy)]
pub struct LoadSpec<'a> {
    pub device: &'a Device,
    /// The activation and weight dtype of families that take one (safetensors checkpoints);
    /// the GGUF engine keeps its file's formats.
    pub dtype: DType,
    /// The precision the CPU engine runs a GGUF decoder's matrices in: a draft model may
    /// run narrower than its file, a target never does.
    pub precision: MatrixPrecision,
}

/// A loaded causal LM and the end-of-sequence ids its config names (empty where the family
/// reads them from its tokenizer).
pub struct LoadedLm {
    pub model: AnyLm,
    pub eos_token_ids: Vec<u32>,
}

/// Every family the crate runs.
pub static FAMILIES: &[&Family] = &[
    &crate::qwen2::FAMILY,
    &crate::gemma4::FAMILY,
    &crate::gemma4_assistant::FAMILY,
];

impl Family {
    /// Its causal LM side; `None` for an MTP assistant.
    pub fn lm(&self) -> Option<&LmFamily> {
        match &self.role {
            Role::CausalLm(lm) => Some(lm),
            Role::MtpAssistant => None,
        }
    }

    pub fn is_mtp_assistant(&self) -> bool {
        matches!(self.role, Role::MtpAssistant)
    }
}

impl PartialEq for Family {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Family {}

/// Families added at run time by [`register`], after [`FAMILIES`].
static REGISTERED: RwLock<Vec<&'static Family>> = RwLock::new(Vec::new());

/// Every family: [`FAMILIES`], then those [`register`] added.
pub fn families() -> Vec<&'static Family> {
    let registered = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    FAMILIES
        .iter()
        .copied()
        .chain(registered.iter().copied())
        .collect()
}

/// Adds `family` for every later lookup. Refused where its name, one of its `model_type`s
/// or one of its GGUF architectures is already another family's (registering the same
/// family again changes nothing).
pub fn register(family: &'static Family) -> Result<()> {
    let mut registered = REGISTERED.write().unwrap_or_else(|e| e.into_inner());
    let known: Vec<&'static Family> = FAMILIES.iter().chain(registered.iter()).copied().collect();
    if known.iter().any(|f| std::ptr::eq(*f, family)) {
        return Ok(());
    }
    let archs = (family.gguf_architectures)();
    for other in known {
        let clash = if other.name == family.name {
            Some(format!("name {:?}", family.name))
        } else if let Some(t) = family
            .model_types
            .iter()
            .find(|t| other.model_types.contains(t))
        {
            Some(format!("model_type {t:?}"))
        } else {
            let theirs = (other.gguf_architectures)();
            archs
                .iter()
                .find(|a| theirs.contains(a))
                .map(|a| format!("GGUF architecture {a:?}"))
        };
        if let Some(clash) = clash {
            return Err(ModelError::Invalid(format!(
                "family {:?}: its {clash} is already {}'s",
                family.name, other.name
            )));
        }
    }
    registered.push(family);
    Ok(())
}

/// The family whose directories have `model_type`.
pub fn by_model_type(model_type: &str) -> Option<&'static Family> {
    families()
        .into_iter()
        .find(|f| f.model_types.contains(&model_type))
}

/// The family whose GGUF files have `architecture`.
pub fn by_gguf_architecture(architecture: &str) -> Option<&'static Family> {
    families()
        .into_iter()
        .find(|f| (f.gguf_architectures)().contains(&architecture))
}

/// Every `model_type` the registry knows, for messages.
pub fn known_model_types() -> Vec<&'static str> {
    families()
        .into_iter()
        .flat_map(|f| f.model_types.iter().copied())
        .collect()
}

/// Every GGUF architecture the registry knows, for messages.
pub fn known_gguf_architectures() -> Vec<&'static str> {
    families()
        .into_iter()
        .flat_map(|f| (f.gguf_architectures)())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_belongs_to_one_family() {
        let mut types = known_model_types();
        let mut archs = known_gguf_architectures();
        let (t, a) = (types.len(), archs.len());
        types.sort();
        types.dedup();
        archs.sort();
        archs.dedup();
        assert_eq!((types.len(), archs.len()), (t, a), "{types:?} {archs:?}");
        let mut names: Vec<_> = FAMILIES.iter().map(|f| f.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), FAMILIES.len());
    }

    #[test]
    fn a_registered_family_may_not_take_another_family_s_names() {
        static CLASH: Family = Family {
            name: "clashing",
            model_types: &["gemma4_text"],
            gguf_architectures: Vec::new,
            role: Role::MtpAssistant,
        };
        let err = register(&CLASH).unwrap_err().to_string();
        assert!(
            err.contains("gemma4_text") && err.contains("Gemma 4"),
            "{err}"
        );
        assert!(!families().iter().any(|f| f.name == "clashing"));
        assert!(register(&crate::gemma4::FAMILY).is_ok());
        assert_eq!(families().len(), FAMILIES.len());
    }

    #[test]
    fn an_mtp_assistant_has_a_family_to_draft_for() {
        for family in FAMILIES.iter().filter(|f| f.is_mtp_assistant()) {
            assert!(
                FAMILIES
                    .iter()
                    .any(|f| f.lm().is_some_and(|lm| lm.exports_kv)),
                "{} drafts for no family",
                family.name
            );
        }
    }
}
