//! What a model path holds, told from the checkpoint itself by the family registry
//! ([`crate::family`]): a Hugging Face directory by its `config.json` `model_type`, a GGUF
//! file by its `general.architecture`.

use std::path::{Path, PathBuf};

use crate::error::{ModelError, Result};
use crate::family::{self, Family, LmFamily, LoadSpec, LoadedLm};

/// A checkpoint the crate can load: its path and its family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSource {
    path: PathBuf,
    family: &'static Family,
}

impl ModelSource {
    pub fn detect(path: &Path) -> Result<Self> {
        let family = if path.is_dir() {
            Self::dir_family(path)?
        } else {
            Self::gguf_family(path)?
        };
        Ok(Self {
            path: path.to_path_buf(),
            family,
        })
    }

    fn gguf_family(path: &Path) -> Result<&'static Family> {
        if !path.is_file() {
            return Err(ModelError::io(
                path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
            ));
        }
        let gguf = crate::gguf::GgufFile::open(path).map_err(|e| {
            ModelError::Invalid(format!(
                "{}: not a model directory or GGUF file: {e}",
                path.display()
            ))
        })?;
        let architecture = match gguf.metadata().get("general.architecture") {
            Some(candle_core::quantized::gguf_file::Value::String(a)) => a.clone(),
            _ => {
                return Err(ModelError::config(
                    "general.architecture",
                    format!("{}: missing or not a string", path.display()),
                ))
            }
        };
        family::by_gguf_architecture(&architecture).ok_or_else(|| {
            ModelError::Unsupported(format!(
                "{}: GGUF architecture {architecture:?} (supported: {})",
                path.display(),
                family::known_gguf_architectures().join(", ")
            ))
        })
    }

    fn dir_family(dir: &Path) -> Result<&'static Family> {
        let config = dir.join("config.json");
        let model_type = crate::config_json::model_type(&crate::config_json::read(dir)?)?
            .ok_or_else(|| {
                ModelError::config("model_type", format!("{}: missing", config.display()))
            })?;
        family::by_model_type(&model_type).ok_or_else(|| {
            ModelError::Unsupported(format!(
                "{}: model_type {model_type:?} (supported: {})",
                config.display(),
                family::known_model_types().join(", ")
            ))
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn family(&self) -> &'static Family {
        self.family
    }

    /// The family's causal LM side, or an error naming the path where the checkpoint is
    /// an MTP assistant.
    pub fn lm_family(&self) -> Result<&'static LmFamily> {
        self.family.lm().ok_or_else(|| {
            ModelError::Unsupported(format!(
                "{}: a {} (an MTP drafter), not a causal LM",
                self.path.display(),
                self.family.name
            ))
        })
    }

    /// Loads the checkpoint as a causal LM (a target or a draft model).
    pub fn load_lm(&self, spec: &LoadSpec<'_>) -> Result<LoadedLm> {
        (self.lm_family()?.load)(&self.path, spec)
    }

    /// The vocabulary size the checkpoint declares, read without loading its weights: the
    /// rows of a GGUF file's `token_embd.weight`, or a directory's `config.json`
    /// `vocab_size` (top level, else `text_config`).
    pub fn vocab_size(&self) -> Result<usize> {
        if self.path.is_dir() {
            let root = crate::config_json::read(&self.path)?;
            let field = |v: &serde_json::Value| v.get("vocab_size").and_then(|n| n.as_u64());
            let vocab = field(&root).or_else(|| root.get("text_config").and_then(field));
            return vocab.map(|n| n as usize).ok_or_else(|| {
                ModelError::config(
                    "vocab_size",
                    format!("{}: missing", self.path.join("config.json").display()),
                )
            });
        }
        let gguf = crate::gguf::GgufFile::open(&self.path)?;
        let dims = gguf.tensor_dims("token_embd.weight")?;
        dims.first().copied().ok_or_else(|| {
            ModelError::Invalid(format!(
                "{}: token_embd.weight has no dimensions",
                self.path.display()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file::{self, Value};

    fn fixtures() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma4")
    }

    fn test_spec() -> LoadSpec<'static> {
        LoadSpec {
            device: &candle_core::Device::Cpu,
            dtype: candle_core::DType::F32,
            precision: crate::MatrixPrecision::Stored,
        }
    }

    fn gguf_with_architecture(architecture: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!(
            "specd-source-{architecture}-{}.gguf",
            std::process::id()
        ));
        let arch = Value::String(architecture.into());
        let mut file = std::fs::File::create(&path).unwrap();
        gguf_file::write(&mut file, &[("general.architecture", &arch)], &[]).unwrap();
        path
    }

    #[test]
    fn directories_are_told_apart_by_model_type() {
        let target = fixtures().join("target-full");
        let source = ModelSource::detect(&target).unwrap();
        assert_eq!(source.family(), &crate::gemma4::FAMILY);
        assert_eq!(source.path(), target.as_path());
        assert_eq!(source.vocab_size().unwrap(), 256);
        let assistant = fixtures().join("assistant-dense");
        let source = ModelSource::detect(&assistant).unwrap();
        assert_eq!(source.family(), &crate::gemma4_assistant::FAMILY);
        let err = source.load_lm(&test_spec()).err().unwrap().to_string();
        assert!(err.contains("not a causal LM"), "{err}");
    }

    #[test]
    fn gguf_files_are_told_apart_by_architecture() {
        let qwen = gguf_with_architecture("qwen2");
        let family = |path: &Path| ModelSource::detect(path).unwrap().family();
        let source = ModelSource::detect(&qwen).unwrap();
        assert_eq!(source.family(), &crate::qwen2::FAMILY);
        assert_eq!(source.path(), qwen.as_path());
        let llama = gguf_with_architecture("llama");
        assert_eq!(family(&llama), &crate::qwen2::FAMILY);
        let gemma4 = gguf_with_architecture("gemma4");
        assert_eq!(family(&gemma4), &crate::gemma4::FAMILY);
        let assistant = gguf_with_architecture("gemma4-assistant");
        assert_eq!(family(&assistant), &crate::gemma4_assistant::FAMILY);
        let gemma3 = gguf_with_architecture("gemma3");
        let err = ModelSource::detect(&gemma3).unwrap_err().to_string();
        assert!(err.contains("\"gemma3\""), "{err}");
        assert!(err.contains("gemma4-assistant"), "{err}");
        assert!(err.contains("llama"), "{err}");
        for path in [qwen, llama, gemma4, assistant, gemma3] {
            let _ = std::fs::remove_file(path);
        }
    }

    #[test]
    fn other_paths_are_errors_naming_the_path() {
        let weights = fixtures().join("target-full/model.safetensors");
        let err = ModelSource::detect(&weights).unwrap_err().to_string();
        assert!(err.contains("model.safetensors"), "{err}");
        let missing = fixtures().join("no-such-model");
        let err = ModelSource::detect(&missing).unwrap_err().to_string();
        assert!(err.contains("no-such-model"), "{err}");
    }
}
