//! An embedding table `[rows, width]` of a candle model: a table the CPU engine takes as stored
//! (quantized, or any table when the model computes in f32 on the CPU) keeps its stored bytes
//! and decodes only the rows a forward looks up; otherwise it is a candle tensor.

use candle_core::{DType, Device, Tensor};

use crate::checkpoint::Checkpoint;
use crate::cpu::{dequantize_row, PackedMatrix, WeightFormat};
use crate::error::{ModelError, Result};
use crate::projection::pack_rows;

pub enum EmbeddingTable {
    Dense(Tensor),
    Stored(StoredTable),
}

/// A table's rows as stored in the file.
pub struct StoredTable {
    format: WeightFormat,
    rows: usize,
    width: usize,
    row_bytes: usize,
    data: Vec<u8>,
    dtype: DType,
    device: Device,
}

impl EmbeddingTable {
    /// Loads the table `name` of shape `[rows, width]`. With `packed`, a stored table also
    /// comes back packed for the CPU kernels, to serve as a tied output projection.
    pub fn load(
        ckpt: &Checkpoint,
        name: &str,
        rows: usize,
        width: usize,
        packed: bool,
    ) -> Result<(Self, Option<PackedMatrix>)> {
        let Some(stored) = ckpt.packable(name, &[rows, width])? else {
            return Ok((Self::Dense(ckpt.tensor(name, &[rows, width])?), None));
        };
        let matrix = packed
            .then(|| pack_rows(ckpt, name, &stored, 0, rows))
            .transpose()?;
        let table = StoredTable {
            format: stored.format,
            rows,
            width,
            row_bytes: stored.row_bytes(),
            data: stored.bytes.into_owned(),
            dtype: ckpt.dtype(),
            device: ckpt.device().clone(),
        };
        ckpt.release(name);
        Ok((Self::Stored(table), matrix))
    }

    /// The rows of `ids` `[n]` as `[n, width]`, in the compute dtype.
    pub fn lookup(&self, ids: &Tensor) -> Result<Tensor> {
        match self {
            Self::Dense(table) => Ok(table.index_select(ids, 0)?),
            Self::Stored(table) => table.lookup(&ids.to_vec1::<u32>()?),
        }
    }

    /// Row `index` `[width]` of the raw weights, in the compute dtype.
    pub fn get(&self, index: usize) -> Result<Tensor> {
        match self {
            Self::Dense(table) => Ok(table.get(index)?),
            Self::Stored(table) => Ok(table.lookup(&[index as u32])?.squeeze(0)?),
        }
    }

    /// The table when it is a candle tensor (a tied output projection over it).
    pub fn dense(&self) -> Option<&Tensor> {
        match self {
            Self::Dense(table) => Some(table),
            Self::Stored(_) => None,
        }
    }
}

impl StoredTable {
    fn lookup(&self, ids: &[u32]) -> Result<Tensor> {
        let mut values = vec![0f32; ids.len() * self.width];
        for (&id, out) in ids.iter().zip(values.chunks_exact_mut(self.width)) {
            let r = id as usize;
            if r >= self.rows {
                return Err(ModelError::Invalid(format!(
                    "token id {id} is not below the embedding table's {} rows",
                    self.rows
                )));
            }
            let row = &self.data[r * self.row_bytes..(r + 1) * self.row_bytes];
            dequantize_row(self.format, row, out);
        }
        let t = Tensor::from_vec(values, (ids.len(), self.width), &Device::Cpu)?;
        Ok(t.to_dtype(self.dtype)?.to_device(&self.device)?)
    }
}
