//! The registry entry of the Llama-style GGUF decoders.

use std::path::Path;

use super::{LoadOptions, Qwen2Model, ARCHITECTURES};
use crate::error::{ModelError, Result};
use crate::family::{AnyLm, EosSource, Family, LmFamily, LoadSpec, LoadedLm, Role};

pub static FAMILY: Family = Family {
    name: "Llama-style GGUF",
    model_types: &[],
    gguf_architectures: || ARCHITECTURES.iter().map(|a| a.name).collect(),
    role: Role::CausalLm(LmFamily {
        load,
        // A GGUF file names its end-of-turn ids in its tokenizer metadata only.
        eos: EosSource::Tokenizer,
        exports_kv: false,
        draft_model: true,
    }),
};

fn load(path: &Path, spec: &LoadSpec<'_>) -> Result<LoadedLm> {
    let options = LoadOptions {
        precision: spec.precision,
        ..LoadOptions::default()
    };
    let model = Qwen2Model::load_with(path, spec.device, &options).map_err(ModelError::from)?;
    Ok(LoadedLm {
        model: AnyLm::new(model),
        eos_token_ids: Vec::new(),
    })
}
