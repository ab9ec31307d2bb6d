//! Reading tensors out of a GGUF file, with shape checks: copied into candle tensors, or
//! borrowed from a read-only map of the file.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use super::error::{GgufError, Result};

/// An open GGUF file: its parsed header, a reader and a read-only map of the tensor data.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: File,
    map: memmap2::Mmap,
}

/// A tensor's bytes as stored in the file.
pub struct RawTensor<'a> {
    pub dtype: GgmlDType,
    /// Candle order (outermost first).
    pub dims: Vec<usize>,
    pub bytes: &'a [u8],
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let io_err = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let reader = File::open(path).map_err(io_err)?;
        // SAFETY: the map is read-only; a GGUF file changing under a running process is
        // outside what any loader can defend against (llama.cpp maps it the same way).
        let map = unsafe { memmap2::Mmap::map(&reader) }.map_err(io_err)?;
        // Parsed from the map: the header holds hundreds of thousands of small strings (the
        // vocabulary and merges), and read from the file each one costs system calls.
        let content = Content::read(&mut std::io::Cursor::new(&map[..])).map_err(|source| {
            GgufError::Unreadable {
                path: path.to_path_buf(),
                source,
            }
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            content,
            reader,
            map,
        })
    }

    /// Where a tensor's stored bytes lie in the file, if the header describes whole blocks
    /// inside it.
    fn stored_range(&self, name: &str) -> Option<std::ops::Range<usize>> {
        let info = self.content.tensor_infos.get(name)?;
        let dtype = info.ggml_dtype;
        let elems = info.shape.elem_count();
        if !elems.is_multiple_of(dtype.block_size()) {
            return None;
        }
        let bytes = elems / dtype.block_size() * dtype.type_size();
        let start = usize::try_from(self.content.tensor_data_offset + info.offset).ok()?;
        let end = start.checked_add(bytes)?;
        (end <= self.map.len()).then_some(start..end)
    }

    /// Drops this process's pages of a tensor's stored bytes (once they have been copied or
    /// repacked), so loading never holds the file and its repacked copy at once. Pages are
    /// read back from the file if the tensor is used again. Best effort.
    pub fn release(&self, name: &str) {
        // Aligned to any page size in use (4 KiB to 64 KiB), inward.
        const ALIGN: usize = 1 << 16;
        let Some(range) = self.stored_range(name) else {
            return;
        };
        let (from, to) = (
            range.start.next_multiple_of(ALIGN),
            range.end / ALIGN * ALIGN,
        );
        if to > from {
            // SAFETY: the map is a private, read-only map of a file nobody writes: dropped
            // pages come back from the file unchanged on the next read.
            let _ = unsafe {
                self.map
                    .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, to - from)
            };
        }
    }

    /// A tensor's stored bytes, after checking its shape, without copying them.
    pub fn raw(&self, name: &str, expected: &[usize]) -> Result<RawTensor<'_>> {
        let dims = self.checked_dims(name, expected)?;
        let info = &self.content.tensor_infos[name];
        match self.stored_range(name) {
            Some(range) => Ok(RawTensor {
                dtype: info.ggml_dtype,
                dims,
                bytes: &self.map[range],
            }),
            None => Err(GgufError::TensorLoad {
                name: name.to_string(),
                source: candle_core::Error::Msg(format!(
                    "{} values of {:?} at offset {} are not whole blocks inside the file ({} \
                     bytes)",
                    info.shape.elem_count(),
                    info.ggml_dtype,
                    self.content.tensor_data_offset + info.offset,
                    self.map.len()
                )),
            }),
        }
    }

    /// The tensor's shape, checked against `expected`.
    fn checked_dims(&self, name: &str, expected: &[usize]) -> Result<Vec<usize>> {
        let found = self.tensor_dims(name)?;
        if found != expected {
            return Err(GgufError::TensorShape {
                name: name.to_string(),
                expected: expected.to_vec(),
                found,
            });
        }
        Ok(found)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// The tensor's shape in candle order (outermost first), without loading it.
    pub fn tensor_dims(&self, name: &str) -> Result<Vec<usize>> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| GgufError::MissingTensor {
                name: name.to_string(),
            })?;
        Ok(info.shape.dims().to_vec())
    }

    /// Loads a tensor as stored, after checking its shape.
    pub fn qtensor(&mut self, name: &str, expected: &[usize], device: &Device) -> Result<QTensor> {
        self.checked_dims(name, expected)?;
        self.content
            .tensor(&mut self.reader, name, device)
            .map_err(|source| GgufError::TensorLoad {
                name: name.to_string(),
                source,
            })
    }

    /// Loads a small tensor (norm weight, bias) as a dense f32 tensor.
    pub fn dense(&mut self, name: &str, expected: &[usize], device: &Device) -> Result<Tensor> {
        let q = self.qtensor(name, expected, device)?;
        q.dequantize(device)
            .and_then(|t| t.to_dtype(DType::F32))
            .map_err(|source| GgufError::TensorLoad {
                name: name.to_string(),
                source,
            })
    }
}
