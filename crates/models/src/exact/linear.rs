//! `y = x W^T` with each output element computed by one fixed-order dot product.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::dot::{dot, dot4};

struct ExactLinear;

/// Output features handled per parallel task.
const FEATURES_PER_TASK: usize = 64;

fn contiguous<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    let data = s.as_slice::<f32>()?;
    let (start, end) = l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg(format!("exact kernel: {what} must be contiguous"))
    })?;
    Ok(&data[start..end])
}

impl CustomOp2 for ExactLinear {
    fn name(&self) -> &'static str {
        "exact-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (m, k) = l1.shape().dims2()?;
        let (n, k2) = l2.shape().dims2()?;
        if k != k2 {
            candle_core::bail!("exact-linear: input width {k} does not match weight width {k2}");
        }
        let x = contiguous(s1, l1, "input")?;
        let w = contiguous(s2, l2, "weight")?;
        // Computed feature-major, so each task reads its weight rows once for all input rows.
        let mut yt = vec![0f32; n * m];
        crate::cpu::ThreadPool::global().for_each_chunk_mut(
            &mut yt,
            FEATURES_PER_TASK * m,
            false,
            |task, out| {
                let first = task * FEATURES_PER_TASK;
                for (jj, out_j) in out.chunks_mut(m).enumerate() {
                    let wj = &w[(first + jj) * k..(first + jj + 1) * k];
                    let row = |i: usize| &x[i * k..(i + 1) * k];
                    let mut i = 0;
                    while i + 4 <= m {
                        let four = dot4([row(i), row(i + 1), row(i + 2), row(i + 3)], wj);
                        out_j[i..i + 4].copy_from_slice(&four);
                        i += 4;
                    }
                    for (r, o) in out_j.iter_mut().enumerate().skip(i) {
                        *o = dot(row(r), wj);
                    }
                }
            },
        );
        let mut y = vec![0f32; m * n];
        for j in 0..n {
            for i in 0..m {
                y[i * n + j] = yt[j * m + i];
            }
        }
        Ok((CpuStorage::F32(y), Shape::from((m, n))))
    }
}

/// `x [m, k]` times `weight [n, k]` transposed, giving `[m, n]`; CPU f32 only.
pub fn exact_linear(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    x.contiguous()?
        .apply_op2_no_bwd(&weight.contiguous()?, &ExactLinear)
}
