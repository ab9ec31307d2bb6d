//! The registry entry of the Gemma 4 targets (checkpoint directories and GGUF files).

use std::path::Path;

use super::gguf::ARCHITECTURE;
use super::Gemma4Model;
use crate::error::Result;
use crate::family::{AnyLm, EosSource, Family, LmFamily, LoadSpec, LoadedLm, Role};

pub static FAMILY: Family = Family {
    name: "Gemma 4",
    model_types: &["gemma4", "gemma4_text"],
    gguf_architectures: || vec![ARCHITECTURE],
    role: Role::CausalLm(LmFamily {
        load,
        eos: EosSource::Config,
        exports_kv: true,
        // Never checked as an independent draft model.
        draft_model: false,
    }),
};

fn load(path: &Path, spec: &LoadSpec<'_>) -> Result<LoadedLm> {
    let model = Gemma4Model::load(path, spec.dtype, spec.device)?;
    let eos_token_ids = model.config().eos_token_ids.clone();
    Ok(LoadedLm {
        model: AnyLm::new(model),
        eos_token_ids,
    })
}
