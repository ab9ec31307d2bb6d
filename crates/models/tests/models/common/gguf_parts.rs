//! A GGUF file's metadata and tensors, to edit and write back (a key removed, a tensor dropped
//! or re-encoded) for the tests of what a loader makes of such a file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

use super::tempdir::TempDir;

pub struct Parts {
    pub metadata: HashMap<String, Value>,
    pub tensors: Vec<(String, QTensor)>,
}

impl Parts {
    pub fn read(path: &Path) -> Self {
        let mut file = std::fs::File::open(path).unwrap();
        let content = Content::read(&mut file).unwrap();
        let mut names: Vec<String> = content.tensor_infos.keys().cloned().collect();
        names.sort();
        let tensors = names
            .into_iter()
            .map(|n| {
                let t = content.tensor(&mut file, &n, &Device::Cpu).unwrap();
                (n, t)
            })
            .collect();
        Self {
            metadata: content.metadata,
            tensors,
        }
    }

    pub fn write(&self, dir: &TempDir, file: &str) -> PathBuf {
        let path = dir.path().join(file);
        let metadata: Vec<(&str, &Value)> =
            self.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let tensors: Vec<(&str, &QTensor)> =
            self.tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
        let mut out = std::fs::File::create(&path).unwrap();
        gguf_file::write(&mut out, &metadata, &tensors).unwrap();
        path
    }

    /// Re-encodes the tensor `name` as `dtype`.
    pub fn tensor_as(&mut self, name: &str, dtype: GgmlDType) {
        let (_, t) = self
            .tensors
            .iter_mut()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no tensor {name}"));
        let dense = t.dequantize(&Device::Cpu).unwrap();
        *t = QTensor::quantize(&dense, dtype).unwrap();
    }

    /// Re-encodes every matrix as `dtype`.
    pub fn matrices_as(&mut self, dtype: GgmlDType) {
        for (_, t) in self.tensors.iter_mut() {
            if t.shape().rank() == 2 {
                let dense = t.dequantize(&Device::Cpu).unwrap();
                *t = QTensor::quantize(&dense, dtype).unwrap();
            }
        }
    }
}
