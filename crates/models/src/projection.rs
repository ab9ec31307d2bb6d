//! A matmul weight `[out, in]` of a candle model: on the CPU with f32 compute, or whenever the
//! file stores it quantized, it is packed as stored into the CPU engine's tiles and multiplied
//! by its kernels (half-precision and quantized weights never widened to f32); otherwise it
//! stays a candle tensor ([`Linear`]).
//!
//! The packed kernels compute every output element by one fixed sequence of operations,
//! whatever rows come with it (see [`crate::cpu`]), so a packed weight keeps the row
//! invariance speculative decoding relies on at any block size, long prefill chunks included.

use candle_core::{DType, Device, Tensor};

use crate::checkpoint::{Checkpoint, StoredMatrix};
use crate::cpu::{matmul, Isa, LayerInput, Output, PackedMatrix, Task, ThreadPool, MAX_TASKS};
use crate::error::{ModelError, Result};
use crate::linear::Linear;

/// A row's largest output and its runner-up, each `(index, value)`; `(u32::MAX, NaN)` where
/// there is none.
pub type BestTwo = [(u32, f32); 2];

pub enum Projection {
    Dense(Linear),
    Packed(PackedProjection),
}

/// A weight in the CPU engine's tiles, with an optional f32 bias.
pub struct PackedProjection {
    matrix: PackedMatrix,
    bias: Option<Vec<f32>>,
}

impl Projection {
    /// Loads `{name}.weight` of shape `[out, in]` and, with `bias`, `{name}.bias`.
    pub fn load(ckpt: &Checkpoint, name: &str, out: usize, inp: usize, bias: bool) -> Result<Self> {
        let weight = format!("{name}.weight");
        let Some(stored) = ckpt.packable(&weight, &[out, inp])? else {
            return Ok(Self::Dense(Linear::load(ckpt, name, out, inp, bias)?));
        };
        let bias = if bias {
            let b = ckpt.tensor_as(&format!("{name}.bias"), &[out], DType::F32)?;
            Some(b.to_device(&Device::Cpu)?.to_vec1::<f32>()?)
        } else {
            None
        };
        let matrix = pack_rows(ckpt, &weight, &stored, 0, out)?;
        ckpt.release(&weight);
        Ok(Self::Packed(PackedProjection { matrix, bias }))
    }

    /// `x [n, in]` to `[n, out]` in `x`'s dtype; `exact` picks the row-exact kernel for a
    /// dense weight (a packed one is always row-exact).
    pub fn forward(&self, x: &Tensor, exact: bool) -> Result<Tensor> {
        match self {
            Self::Dense(linear) => linear.forward(x, exact),
            Self::Packed(packed) => Ok(run_packed(&[packed], x)?.remove(0)),
        }
    }

    /// [`Self::forward`] of several projections of the same input (q/k/v, gate/up): when all
    /// are packed they share one prepared input and one parallel region.
    pub fn forward_all(projections: &[&Self], x: &Tensor, exact: bool) -> Result<Vec<Tensor>> {
        let packed: Option<Vec<&PackedProjection>> = projections
            .iter()
            .map(|p| match p {
                Self::Packed(packed) => Some(packed),
                Self::Dense(_) => None,
            })
            .collect();
        match packed {
            Some(packed) if packed.len() <= MAX_TASKS => run_packed(&packed, x),
            _ => projections.iter().map(|p| p.forward(x, exact)).collect(),
        }
    }

    /// Each row of `x [n, in]`'s largest output among the first `below` (clamped to the
    /// outputs) and its runner-up, the lowest index winning among equals and NaN never, from
    /// the packed kernels' argmax epilogue, which stores no output row. `None` for a dense
    /// weight, one with a bias, or rows not in f32: the caller computes the outputs then.
    pub fn best_two(&self, x: &Tensor, below: usize) -> Result<Option<Vec<BestTwo>>> {
        let Self::Packed(packed) = self else {
            return Ok(None);
        };
        // Outputs in a narrower dtype are rounded before the caller compares them: only f32
        // ones compare as the epilogue's.
        if packed.bias.is_some() || x.dtype() != DType::F32 {
            return Ok(None);
        }
        let matrix = &packed.matrix;
        let (input, pool) = prepared_input(&[matrix], x)?;
        let n = input.rows();
        let mut best = vec![(u32::MAX, f32::NAN); n];
        let mut runner_up = vec![(u32::MAX, f32::NAN); n];
        matmul(
            &mut [Task {
                matrix,
                input: &input,
                output: Output::Argmax {
                    best: &mut best,
                    runner_up: Some(&mut runner_up),
                    below: below.clamp(1, matrix.out_features()),
                },
            }],
            pool,
            Isa::active(),
        );
        Ok(Some(
            best.into_iter()
                .zip(runner_up)
                .map(|(b, r)| [b, r])
                .collect(),
        ))
    }
}

impl From<Linear> for Projection {
    fn from(linear: Linear) -> Self {
        Self::Dense(linear)
    }
}

impl From<PackedMatrix> for Projection {
    fn from(matrix: PackedMatrix) -> Self {
        Self::Packed(PackedProjection { matrix, bias: None })
    }
}

/// Rows `first .. first + out` of the stored tensor `name` (rows counted across its outer
/// dimensions, so one expert of a 3-D weight is a run of rows) as a packed `[out, in]` weight.
pub(crate) fn pack_rows(
    ckpt: &Checkpoint,
    name: &str,
    stored: &StoredMatrix<'_>,
    first: usize,
    out: usize,
) -> Result<PackedMatrix> {
    if !ckpt.device().is_cpu() {
        return Err(ModelError::Unsupported(format!(
            "tensor {name} is stored as {:?}: quantized weights run on the CPU only",
            stored.format
        )));
    }
    let inp = stored.dims.last().copied().unwrap_or(0);
    PackedMatrix::from_gguf(
        stored.format,
        out,
        inp,
        stored.rows(first, out),
        ThreadPool::global(),
    )
    .map_err(|e| ModelError::Invalid(format!("tensor {name}: {e}")))
}

/// `x [n, in]` through each packed projection in one parallel region, as `[n, out]` tensors
/// in `x`'s dtype.
fn run_packed(projections: &[&PackedProjection], x: &Tensor) -> Result<Vec<Tensor>> {
    let matrices: Vec<&PackedMatrix> = projections.iter().map(|p| &p.matrix).collect();
    let (input, pool) = prepared_input(&matrices, x)?;
    let n = input.rows();
    let mut outputs: Vec<Vec<f32>> = projections
        .iter()
        .map(|p| vec![0f32; n * p.matrix.out_features()])
        .collect();
    let mut tasks: Vec<Task<'_>> = projections
        .iter()
        .zip(outputs.iter_mut())
        .map(|(p, out)| Task {
            matrix: &p.matrix,
            input: &input,
            output: Output::Store {
                out,
                bias: p.bias.as_deref(),
            },
        })
        .collect();
    matmul(&mut tasks, pool, Isa::active());
    drop(tasks);
    projections
        .iter()
        .zip(outputs)
        .map(|(p, y)| {
            let y = Tensor::from_vec(y, (n, p.matrix.out_features()), x.device())?;
            Ok(y.to_dtype(x.dtype())?)
        })
        .collect()
}

/// The rows of `x [n, in]` as the kernels of every matrix read them, after checking that each
/// takes rows of `in`.
fn prepared_input(
    matrices: &[&PackedMatrix],
    x: &Tensor,
) -> Result<(LayerInput, &'static ThreadPool)> {
    let (n, inp) = x.dims2()?;
    if let Some(m) = matrices.iter().find(|m| m.in_features() != inp) {
        return Err(ModelError::Invalid(format!(
            "a packed [{}, {}] weight applied to rows of {inp}",
            m.out_features(),
            m.in_features()
        )));
    }
    let values = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let pool = ThreadPool::global();
    let mut input = LayerInput::default();
    input.reset(n, inp).copy_from_slice(&values);
    input.prepare_for(matrices, pool);
    Ok((input, pool))
}
