//! A matmul weight `[out, in]` of a candle model in whichever form its checkpoint stores it: a
//! float weight stays a candle tensor ([`Linear`], unchanged), a quantized one is packed into
//! the CPU engine's tiles and multiplied by its kernels, never expanded to floats.
//!
//! The packed kernels compute every output element by one fixed sequence of operations,
//! whatever rows come with it (see [`crate::cpu`]), so a quantized weight keeps the row
//! invariance speculative decoding relies on at any block size, long prefill chunks included.

use candle_core::{DType, Device, Tensor};

use crate::checkpoint::{Checkpoint, Quantized};
use crate::cpu::{matmul, Isa, LayerInput, Output, PackedMatrix, Task, ThreadPool};
use crate::error::{ModelError, Result};
use crate::linear::Linear;

pub enum Projection {
    Dense(Linear),
    Packed(PackedProjection),
}

/// A quantized weight in the CPU engine's tiles, with an optional f32 bias.
pub struct PackedProjection {
    matrix: PackedMatrix,
    bias: Option<Vec<f32>>,
}

impl Projection {
    /// Loads `{name}.weight` of shape `[out, in]` and, with `bias`, `{name}.bias`.
    pub fn load(ckpt: &Checkpoint, name: &str, out: usize, inp: usize, bias: bool) -> Result<Self> {
        let weight = format!("{name}.weight");
        let Some(stored) = ckpt.quantized(&weight, &[out, inp])? else {
            return Ok(Self::Dense(Linear::load(ckpt, name, out, inp, bias)?));
        };
        let bias = if bias {
            let b = ckpt.tensor_as(&format!("{name}.bias"), &[out], DType::F32)?;
            Some(b.to_device(&Device::Cpu)?.to_vec1::<f32>()?)
        } else {
            None
        };
        Ok(Self::Packed(PackedProjection {
            matrix: pack_rows(ckpt, &weight, &stored, 0, out)?,
            bias,
        }))
    }

    /// `x [n, in]` to `[n, out]` in `x`'s dtype; `exact` picks the row-exact kernel for a
    /// dense weight (a packed one is always row-exact).
    pub fn forward(&self, x: &Tensor, exact: bool) -> Result<Tensor> {
        match self {
            Self::Dense(linear) => linear.forward(x, exact),
            Self::Packed(packed) => packed.forward(x),
        }
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

/// Rows `first .. first + out` of the quantized tensor `name` (rows counted across its outer
/// dimensions, so one expert of a 3-D weight is a run of rows) as a packed `[out, in]` weight.
pub(crate) fn pack_rows(
    ckpt: &Checkpoint,
    name: &str,
    stored: &Quantized<'_>,
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

impl PackedProjection {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (n, inp) = x.dims2()?;
        let out = self.matrix.out_features();
        if inp != self.matrix.in_features() {
            return Err(ModelError::Invalid(format!(
                "a packed [{out}, {}] weight applied to rows of {inp}",
                self.matrix.in_features()
            )));
        }
        let values = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let pool = ThreadPool::global();
        let mut input = LayerInput::default();
        input.reset(n, inp).copy_from_slice(&values);
        input.prepare_for(&[&self.matrix], pool);
        let mut y = vec![0f32; n * out];
        matmul(
            &mut [Task {
                matrix: &self.matrix,
                input: &input,
                output: Output::Store {
                    out: &mut y,
                    bias: self.bias.as_deref(),
                },
            }],
            pool,
            Isa::active(),
        );
        Ok(Tensor::from_vec(y, (n, out), x.device())?.to_dtype(x.dtype())?)
    }
}
