//! What a model path holds, told from the checkpoint itself: a Hugging Face directory by its
//! `config.json` `model_type`, a GGUF file by its `general.architecture` (`gemma4` is a Gemma 4
//! target, `gemma4-assistant` its assistant, a Llama-style architecture (`qwen2`, `llama`)
//! runs on the GGUF engine).

use std::path::{Path, PathBuf};

use crate::error::{ModelError, Result};

/// A checkpoint the crate can load, and which loader it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A Gemma 4 target: a checkpoint directory (`gemma4_text`, or the multimodal `gemma4`) or a
    /// GGUF file of architecture `gemma4`.
    Gemma4 { path: PathBuf },
    /// A Gemma 4 assistant (MTP drafter): a checkpoint directory (`gemma4_assistant`) or a
    /// GGUF file of architecture `gemma4-assistant`.
    Gemma4Assistant { path: PathBuf },
    /// A GGUF file of a Llama-style dense decoder (Qwen2, Qwen2.5, Llama 3, SmolLM2: one of
    /// [`crate::qwen2::ARCHITECTURES`]), on the GGUF engine; a target or a draft model.
    LlamaStyle { path: PathBuf, architecture: String },
}

impl ModelSource {
    pub fn detect(path: &Path) -> Result<Self> {
        if path.is_dir() {
            return Self::from_dir(path);
        }
        if !path.is_file() {
            return Err(ModelError::io(
                path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
            ));
        }
        let gguf = crate::qwen2::GgufFile::open(path).map_err(|e| {
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
        if architecture == crate::gemma4::gguf::ARCHITECTURE {
            return Ok(Self::Gemma4 {
                path: path.to_path_buf(),
            });
        }
        if architecture == crate::gemma4::gguf::ASSISTANT_ARCHITECTURE {
            return Ok(Self::Gemma4Assistant {
                path: path.to_path_buf(),
            });
        }
        if crate::qwen2::architecture(&architecture).is_none() {
            let llama_style: Vec<&str> =
                crate::qwen2::ARCHITECTURES.iter().map(|a| a.name).collect();
            return Err(ModelError::Unsupported(format!(
                "{}: GGUF architecture {architecture:?} (supported: {}, {}, {})",
                path.display(),
                llama_style.join(", "),
                crate::gemma4::gguf::ARCHITECTURE,
                crate::gemma4::gguf::ASSISTANT_ARCHITECTURE
            )));
        }
        Ok(Self::LlamaStyle {
            path: path.to_path_buf(),
            architecture,
        })
    }

    fn from_dir(dir: &Path) -> Result<Self> {
        let config = dir.join("config.json");
        let model_type = crate::config_json::model_type(&crate::config_json::read(dir)?)?
            .ok_or_else(|| {
                ModelError::config("model_type", format!("{}: missing", config.display()))
            })?;
        match model_type.as_str() {
            "gemma4" | "gemma4_text" => Ok(Self::Gemma4 {
                path: dir.to_path_buf(),
            }),
            "gemma4_assistant" => Ok(Self::Gemma4Assistant {
                path: dir.to_path_buf(),
            }),
            other => Err(ModelError::Unsupported(format!(
                "{}: model_type {other:?} (supported: gemma4, gemma4_text, gemma4_assistant)",
                config.display()
            ))),
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Self::Gemma4 { path }
            | Self::Gemma4Assistant { path }
            | Self::LlamaStyle { path, .. } => path,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file::{self, Value};

    fn fixtures() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma4")
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
        assert_eq!(
            ModelSource::detect(&target).unwrap(),
            ModelSource::Gemma4 { path: target }
        );
        let assistant = fixtures().join("assistant-dense");
        assert_eq!(
            ModelSource::detect(&assistant).unwrap(),
            ModelSource::Gemma4Assistant { path: assistant }
        );
    }

    #[test]
    fn gguf_files_are_told_apart_by_architecture() {
        let qwen = gguf_with_architecture("qwen2");
        let source = ModelSource::detect(&qwen).unwrap();
        assert!(matches!(source, ModelSource::LlamaStyle { .. }));
        assert_eq!(source.path(), qwen.as_path());
        let llama = gguf_with_architecture("llama");
        assert_eq!(
            ModelSource::detect(&llama).unwrap(),
            ModelSource::LlamaStyle {
                path: llama.clone(),
                architecture: "llama".into()
            }
        );
        let gemma4 = gguf_with_architecture("gemma4");
        assert_eq!(
            ModelSource::detect(&gemma4).unwrap(),
            ModelSource::Gemma4 {
                path: gemma4.clone()
            }
        );
        let assistant = gguf_with_architecture("gemma4-assistant");
        assert_eq!(
            ModelSource::detect(&assistant).unwrap(),
            ModelSource::Gemma4Assistant {
                path: assistant.clone()
            }
        );
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
