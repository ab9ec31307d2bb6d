//! A GGUF linear layer (`x W^T + b`) whose rows do not depend on each other.
//!
//! Speculative decoding is lossless only if a token's logits are the same whether the token is
//! decoded alone or verified inside a block. Dense (F32/F16/BF16) weights therefore run on
//! CPU through the fixed-order kernel in `kernels`. candle's CPU kernels for quantized weights
//! compute each row on its own, but some pick a different kernel for a single row than for
//! several (for example Q6K on x86: a compact GEMV for one row, repacked tiles for more), and
//! the two round differently. At load time each quantized weight shape is probed once; a
//! layer whose single-row result differs from its result inside a block runs single rows as
//! a block of two, and, failing that, runs every row on its own.

use std::borrow::Cow;
use std::collections::HashMap;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use super::error::Result;
use super::kernels::dense_matmul_t;

/// How a quantized layer runs so that each row's result is independent of the rows beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowMode {
    /// The kernel already gives every row the same result for any row count.
    Direct,
    /// A single row is duplicated into a block of two, which takes the block kernel.
    PadSingleRow,
    /// Every row is multiplied on its own.
    EachRowAlone,
}

const PROBE_ROWS: usize = 128;

/// Block sizes a row is probed in: they reach candle's single-row, tiled and leftover-row
/// kernels (tiles of 4 rows on aarch64, of up to 16 on x86, AMX from 32 rows on Intel).
const PROBE_BLOCKS: [usize; 4] = [3, 6, 19, 33];

/// Probe results shared by the layers of one model: the kernel choice depends only on the
/// format and the shape, so one probe per (format, rows, columns) suffices.
pub struct RowModeProbe {
    enabled: bool,
    modes: HashMap<(GgmlDType, usize, usize), RowMode>,
}

impl RowModeProbe {
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            modes: HashMap::new(),
        }
    }

    fn mode_for(&mut self, name: &str, weight: &QTensor) -> Result<RowMode> {
        let device = weight.device();
        if !self.enabled || !device.is_cpu() {
            return Ok(RowMode::Direct);
        }
        let (out_features, in_features) = weight.shape().dims2()?;
        let key = (weight.dtype(), out_features, in_features);
        if let Some(mode) = self.modes.get(&key) {
            return Ok(*mode);
        }
        let mode = probe(
            &QMatMul::from_qtensor(probe_slice(weight)?)?,
            in_features,
            &device,
        )?;
        let dtype = weight.dtype();
        match mode {
            RowMode::Direct => tracing::debug!(tensor = name, ?dtype, "row-invariant kernel"),
            _ => tracing::info!(
                tensor = name,
                ?dtype,
                ?mode,
                "single-row kernel differs from the block kernel"
            ),
        }
        self.modes.insert(key, mode);
        Ok(mode)
    }
}

/// The first rows of a large weight, enough to probe its kernels cheaply. The row count keeps
/// the original's residue modulo 128, so divisibility-based kernel choices stay the same.
fn probe_slice(weight: &QTensor) -> Result<QTensor> {
    let (out_features, in_features) = weight.shape().dims2()?;
    let rows = PROBE_ROWS + out_features % PROBE_ROWS;
    let dtype = weight.dtype();
    let row_bytes = in_features / dtype.block_size() * dtype.type_size();
    let data = weight.data()?;
    if rows >= out_features || data.len() != out_features * row_bytes {
        return Ok(QTensor::new(
            QStorage::from_data(data, &weight.device(), dtype)?,
            (out_features, in_features),
        )?);
    }
    let storage = QStorage::from_data(
        Cow::Borrowed(&data[..rows * row_bytes]),
        &weight.device(),
        dtype,
    )?;
    Ok(QTensor::new(storage, (rows, in_features))?)
}

/// Finds the first mode under which one row multiplied alone gives the same bits as the same
/// row in the middle of blocks of several sizes.
fn probe(weight: &QMatMul, in_features: usize, device: &Device) -> Result<RowMode> {
    let row = |phase: f32| -> Vec<f32> {
        (0..in_features)
            .map(|i| ((i as f32) * 0.618 + phase).sin() * 0.5)
            .collect()
    };
    let probe_row = row(1.7);
    let mut in_blocks = Vec::new();
    for size in PROBE_BLOCKS {
        let at = size / 2;
        let block: Vec<f32> = (0..size)
            .flat_map(|r| {
                if r == at {
                    probe_row.clone()
                } else {
                    row(r as f32 * 0.37)
                }
            })
            .collect();
        let block = Tensor::from_vec(block, (size, in_features), device)?;
        in_blocks.push(
            weight
                .forward(&block)?
                .narrow(0, at, 1)?
                .flatten_all()?
                .to_vec1::<f32>()?,
        );
    }
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    if !in_blocks.windows(2).all(|w| same(&w[0], &w[1])) {
        return Ok(RowMode::EachRowAlone);
    }
    let alone = Tensor::from_vec(probe_row, (1, in_features), device)?;
    for mode in [RowMode::Direct, RowMode::PadSingleRow] {
        let single = run_rows(weight, &alone, mode)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        if same(&single, &in_blocks[0]) {
            return Ok(mode);
        }
    }
    Ok(RowMode::EachRowAlone)
}

fn run_rows(weight: &QMatMul, x: &Tensor, mode: RowMode) -> Result<Tensor> {
    let rows = x.dim(0)?;
    let y = match mode {
        RowMode::Direct => weight.forward(x)?,
        RowMode::PadSingleRow if rows == 1 => {
            weight.forward(&Tensor::cat(&[x, x], 0)?)?.narrow(0, 0, 1)?
        }
        RowMode::PadSingleRow => weight.forward(x)?,
        RowMode::EachRowAlone if rows == 1 => weight.forward(x)?,
        RowMode::EachRowAlone => {
            let parts = (0..rows)
                .map(|r| weight.forward(&x.narrow(0, r, 1)?))
                .collect::<candle_core::Result<Vec<_>>>()?;
            Tensor::cat(&parts, 0)?
        }
    };
    Ok(y)
}

enum Weight {
    Quantized {
        matmul: QMatMul,
        row_mode: RowMode,
    },
    /// `[out, in]` f32; `exact` selects the fixed-order CPU kernel.
    Dense {
        w: Tensor,
        exact: bool,
    },
}

pub struct QLinear {
    weight: Weight,
    bias: Option<Tensor>,
}

impl QLinear {
    /// `weight` is `[out, in]`; `bias`, when present, is `[out]` f32.
    pub fn new(
        name: &str,
        weight: QTensor,
        bias: Option<Tensor>,
        probe: &mut RowModeProbe,
    ) -> Result<Self> {
        let dtype = weight.dtype();
        let device = weight.device();
        let weight = if matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) {
            let w = weight
                .dequantize(&device)?
                .to_dtype(DType::F32)?
                .contiguous()?;
            Weight::Dense {
                w,
                exact: probe.enabled && device.is_cpu(),
            }
        } else {
            let row_mode = probe.mode_for(name, &weight)?;
            Weight::Quantized {
                matmul: QMatMul::from_qtensor(weight)?,
                row_mode,
            }
        };
        Ok(Self { weight, bias })
    }

    /// `x [m, in]` to `[m, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.contiguous()?;
        let y = match &self.weight {
            Weight::Quantized { matmul, row_mode } => run_rows(matmul, &x, *row_mode)?,
            Weight::Dense { w, exact: true } => dense_matmul_t(&x, w)?,
            Weight::Dense { w, exact: false } => x.matmul(&w.t()?)?,
        };
        let y = match &self.bias {
            Some(bias) => y.broadcast_add(bias)?,
            None => y,
        };
        Ok(y.to_dtype(DType::F32)?)
    }
}
