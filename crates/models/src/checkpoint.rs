//! Memory-mapped safetensors checkpoints, single-file or sharded through
//! `model.safetensors.index.json`. Tensors are read only when asked for, so weights of other
//! modalities in a multimodal checkpoint are never touched.
//!
//! A checkpoint can also be backed by a file of another format (a [`TensorStore`], such as a
//! Gemma 4 GGUF file) that answers to the Hugging Face names the loaders ask for. Such a file
//! may store tensors quantized; those are handed over as stored ([`StoredMatrix`]), for the
//! loaders to pack for the CPU engine's kernels, never expanded to floats.
//!
//! On the CPU with f32 compute, float matrices (F32, F16, BF16, from either kind of file) are
//! handed over as stored too: the engine's kernels read half-precision weights as they are, so
//! a step streams the bytes the file holds rather than a widened copy, and every output
//! element is one fixed sequence of operations whatever rows come with it.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use serde::Deserialize;

use crate::cpu::WeightFormat;
use crate::error::{ModelError, Result};

pub struct Checkpoint {
    files: Store,
    dtype: DType,
    device: Device,
}

enum Store {
    Safetensors(MmapedSafetensors),
    Other(Box<dyn TensorStore>),
}

/// Tensors of a file other than safetensors, under the Hugging Face names the loaders use.
pub(crate) trait TensorStore: Send + Sync {
    /// The shape of the tensor the loaders call `name`; `None` when the file lacks it.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// The tensor on the CPU, in the float dtype the file stores it in.
    fn load(&self, name: &str) -> Result<Tensor>;
    /// How errors name the tensor: by its name in the file, which is what a user can look up.
    fn display_name(&self, name: &str) -> String;
    /// The tensor as stored when the file stores it quantized, and with `floats` also when
    /// it stores it as F32, F16 or BF16; otherwise `None`, and [`Self::load`] reads it. A
    /// quantized type without a CPU kernel is an error naming the tensor and the type.
    fn stored(&self, _name: &str, _floats: bool) -> Result<Option<StoredMatrix<'_>>> {
        Ok(None)
    }
    /// Drops this process's pages of the tensor's stored bytes once a loader holds its own
    /// copy (packed tiles), so loading never holds both. Best effort.
    fn release(&self, _name: &str) {}
}

/// A tensor's bytes as stored, for the CPU engine to pack: rows of its innermost dimension,
/// each a whole number of `format` blocks, outermost dimensions first.
pub(crate) struct StoredMatrix<'a> {
    pub format: WeightFormat,
    /// Candle order (outermost first).
    pub dims: Vec<usize>,
    pub bytes: Cow<'a, [u8]>,
}

impl StoredMatrix<'_> {
    /// Bytes of one row (one innermost slice).
    pub fn row_bytes(&self) -> usize {
        let width = self.dims.last().copied().unwrap_or(0);
        width / self.format.block_len() * self.format.block_bytes()
    }

    /// Rows `from .. from + count`, counting rows across the outer dimensions.
    pub fn rows(&self, from: usize, count: usize) -> &[u8] {
        let b = self.row_bytes();
        &self.bytes[from * b..(from + count) * b]
    }
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
            files: Store::Safetensors(files),
            dtype,
            device: device.clone(),
        })
    }

    /// A checkpoint read from `store`; tensors are converted to `dtype` on `device` when loaded.
    pub(crate) fn from_store(store: Box<dyn TensorStore>, dtype: DType, device: &Device) -> Self {
        Self {
            files: Store::Other(store),
            dtype,
            device: device.clone(),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        match &self.files {
            Store::Safetensors(files) => files.get(name).is_ok(),
            Store::Other(store) => store.shape(name).is_some(),
        }
    }

    /// The name errors give the tensor `name`.
    fn display_name(&self, name: &str) -> String {
        match &self.files {
            Store::Safetensors(_) => name.to_string(),
            Store::Other(store) => store.display_name(name),
        }
    }

    pub fn shape_of(&self, name: &str) -> Result<Vec<usize>> {
        let missing = || ModelError::MissingTensor {
            name: self.display_name(name),
        };
        match &self.files {
            Store::Safetensors(files) => {
                Ok(files.get(name).map_err(|_| missing())?.shape().to_vec())
            }
            Store::Other(store) => store.shape(name).ok_or_else(missing),
        }
    }

    /// The matrix `name` as stored, for the CPU engine's kernels, after checking its shape:
    /// always when the file stores it quantized (only files other than safetensors do), and
    /// float matrices too when the model computes in f32 on the CPU. `None` means a candle
    /// tensor, which [`Self::tensor`] loads.
    pub(crate) fn packable(&self, name: &str, shape: &[usize]) -> Result<Option<StoredMatrix<'_>>> {
        self.expect_shape(name, shape)?;
        let floats = self.device.is_cpu() && self.dtype == DType::F32;
        match &self.files {
            Store::Other(store) => store.stored(name, floats),
            Store::Safetensors(_) if !floats => Ok(None),
            Store::Safetensors(files) => {
                let view = files.get(name).map_err(|_| ModelError::MissingTensor {
                    name: name.to_string(),
                })?;
                let format = match view.dtype() {
                    safetensors::Dtype::F32 => WeightFormat::F32,
                    safetensors::Dtype::F16 => WeightFormat::F16,
                    safetensors::Dtype::BF16 => WeightFormat::BF16,
                    _ => return Ok(None),
                };
                Ok(Some(StoredMatrix {
                    format,
                    dims: shape.to_vec(),
                    bytes: Cow::Borrowed(view.data()),
                }))
            }
        }
    }

    /// Drops the mapped pages of `name` once a loader has packed its own copy of the stored
    /// bytes; they are read back from the file if asked for again.
    pub(crate) fn release(&self, name: &str) {
        match &self.files {
            Store::Other(store) => store.release(name),
            Store::Safetensors(files) => {
                if let Ok(view) = files.get(name) {
                    drop_mapped_pages(view.data());
                }
            }
        }
    }

    /// `name` on the CPU as stored.
    fn load_stored(&self, name: &str) -> Result<Tensor> {
        match &self.files {
            Store::Safetensors(files) => Ok(files.load(name, &Device::Cpu)?),
            Store::Other(store) => store.load(name),
        }
    }

    /// Loads `name`, checking its shape, as the compute dtype on the compute device.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.tensor_as(name, shape, self.dtype)
    }

    /// Fails, naming `name`, unless the stored tensor has `shape`.
    fn expect_shape(&self, name: &str, shape: &[usize]) -> Result<()> {
        let found = self.shape_of(name)?;
        if found != shape {
            return Err(ModelError::ShapeMismatch {
                name: self.display_name(name),
                expected: shape.to_vec(),
                found,
            });
        }
        Ok(())
    }

    /// Loads `name` with an explicit dtype (integer buffers keep theirs).
    pub fn tensor_as(&self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.expect_shape(name, shape)?;
        let t = self.load_stored(name)?;
        Ok(t.to_dtype(dtype)?.to_device(&self.device)?)
    }

    /// Loads `name` whatever its shape (for tensors whose shape is checked by the caller).
    pub fn tensor_any_shape(&self, name: &str, dtype: DType) -> Result<Tensor> {
        self.shape_of(name)?;
        let t = self.load_stored(name)?;
        Ok(t.to_dtype(dtype)?.to_device(&self.device)?)
    }

    /// Row `index` of the 2-D tensor `name` as `[1, width]` in the compute dtype, read from the
    /// mapped file without loading the rest of the tensor.
    pub(crate) fn row(&self, name: &str, index: usize) -> Result<Tensor> {
        let files = match &self.files {
            Store::Safetensors(files) => files,
            Store::Other(_) => return self.row_of_loaded(name, index),
        };
        let view = files.get(name).map_err(|_| ModelError::MissingTensor {
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

    /// [`Self::row`] for stores without a row-wise reader: the whole tensor is loaded.
    fn row_of_loaded(&self, name: &str, index: usize) -> Result<Tensor> {
        let t = self.load_stored(name)?;
        let &[rows, _] = t.dims() else {
            return Err(ModelError::Invalid(format!(
                "tensor {}: expected 2 dimensions, found {:?}",
                self.display_name(name),
                t.dims()
            )));
        };
        if index >= rows {
            return Err(ModelError::Invalid(format!(
                "tensor {}: row {index} is not below {rows}",
                self.display_name(name)
            )));
        }
        Ok(t.narrow(0, index, 1)?
            .to_dtype(self.dtype)?
            .to_device(&self.device)?)
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }
}

/// Drops this process's pages of `bytes`, a slice of a read-only file mapping, inward to
/// whole 64 KiB (any page size in use); they are read back from the file if touched again.
/// Best effort, as for a GGUF file (`GgufFile::release`).
fn drop_mapped_pages(bytes: &[u8]) {
    #[cfg(unix)]
    {
        const ALIGN: usize = 1 << 16;
        let start = bytes.as_ptr() as usize;
        let (from, to) = (
            start.next_multiple_of(ALIGN),
            (start + bytes.len()) / ALIGN * ALIGN,
        );
        if to > from {
            // SAFETY: the range lies inside a read-only mapping of a file nobody writes;
            // dropped pages come back from the file unchanged on the next read, so every
            // slice into it stays valid.
            unsafe {
                libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_DONTNEED);
            }
        }
    }
    #[cfg(not(unix))]
    let _ = bytes;
}
