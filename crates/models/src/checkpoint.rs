//! Memory-mapped safetensors checkpoints, single-file or sharded through
//! `model.safetensors.index.json`. Tensors are read only when asked for, so weights of other
//! modalities in a multimodal checkpoint are never touched.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::error::{ModelError, Result};

pub struct Checkpoint {
    files: MmapedSafetensors,
    dtype: DType,
    device: Device,
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: std::collections::BTreeMap<String, String>,
}

/// The safetensors files of a checkpoint directory.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
        let parsed: ShardIndex = serde_json::from_str(&text)
            .map_err(|e| ModelError::config("model.safetensors.index.json", e.to_string()))?;
        let shards: BTreeSet<&String> = parsed.weight_map.values().collect();
        let mut files = Vec::with_capacity(shards.len());
        for shard in shards {
            if shard.contains('/') || shard.contains('\\') {
                return Err(ModelError::config(
                    "model.safetensors.index.json.weight_map",
                    format!("shard name {shard:?} must be a file in the checkpoint directory"),
                ));
            }
            let path = dir.join(shard);
            if !path.exists() {
                return Err(ModelError::io(
                    &path,
                    std::io::Error::from(std::io::ErrorKind::NotFound),
                ));
            }
            files.push(path);
        }
        return Ok(files);
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    Err(ModelError::io(
        &single,
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no model.safetensors or model.safetensors.index.json",
        ),
    ))
}

impl Checkpoint {
    /// Maps the checkpoint in `dir`; tensors are converted to `dtype` on `device` when loaded.
    pub fn open(dir: &Path, dtype: DType, device: &Device) -> Result<Self> {
        let files = safetensors_files(dir)?;
        // SAFETY: the files are mapped read-only; like every mmap-based loader we rely on them
        // not being truncated while the process runs.
        let files = unsafe { MmapedSafetensors::multi(&files)? };
        Ok(Self {
            files,
            dtype,
            device: device.clone(),
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.files.get(name).is_ok()
    }

    pub fn shape_of(&self, name: &str) -> Result<Vec<usize>> {
        let view = self
            .files
            .get(name)
            .map_err(|_| ModelError::MissingTensor {
                name: name.to_string(),
            })?;
        Ok(view.shape().to_vec())
    }

    /// Loads `name`, checking its shape, as the compute dtype on the compute device.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.tensor_as(name, shape, self.dtype)
    }

    /// Loads `name` with an explicit dtype (integer buffers keep theirs).
    pub fn tensor_as(&self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let found = self.shape_of(name)?;
        if found != shape {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                expected: shape.to_vec(),
                found,
            });
        }
        let t = self.files.load(name, &Device::Cpu)?;
        Ok(t.to_dtype(dtype)?.to_device(&self.device)?)
    }

    /// Loads `name` whatever its shape (for tensors whose shape is checked by the caller).
    pub fn tensor_any_shape(&self, name: &str, dtype: DType) -> Result<Tensor> {
        self.shape_of(name)?;
        let t = self.files.load(name, &Device::Cpu)?;
        Ok(t.to_dtype(dtype)?.to_device(&self.device)?)
    }

    /// Row `index` of the 2-D tensor `name` as `[1, width]` in the compute dtype, read from the
    /// mapped file without loading the rest of the tensor.
    pub(crate) fn row(&self, name: &str, index: usize) -> Result<Tensor> {
        let view = self
            .files
            .get(name)
            .map_err(|_| ModelError::MissingTensor {
                name: name.to_string(),
            })?;
        let &[rows, width] = view.shape() else {
            return Err(ModelError::Invalid(format!(
                "tensor {name}: expected 2 dimensions, found {:?}",
                view.shape()
            )));
        };
        if index >= rows {
            return Err(ModelError::Invalid(format!(
                "tensor {name}: row {index} is not below {rows}"
            )));
        }
        let dtype = DType::try_from(view.dtype())?;
        let bytes = width * dtype.size_in_bytes();
        let data = &view.data()[index * bytes..(index + 1) * bytes];
        let t = Tensor::from_raw_buffer(data, dtype, &[1, width], &Device::Cpu)?;
        Ok(t.to_dtype(self.dtype)?.to_device(&self.device)?)
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }
}
