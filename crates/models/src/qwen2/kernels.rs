//! Fixed-order f32 CPU kernels: a dot product, an axpy, and a dense matmul built on them.
//!
//! Every output element is one dot product over its inputs in a fixed order, so a row's
//! result does not depend on how many rows are computed with it (general GEMM kernels pick
//! their blocking, and so their rounding, from the matrix sizes).

use std::sync::atomic::{AtomicU32, Ordering};

use candle_core::{Device, Layout, Storage, Tensor};

use super::error::{Qwen2Error, Result};

pub(crate) fn cpu_slice<'a>(
    storage: &'a Storage,
    layout: &Layout,
    what: &str,
) -> Result<&'a [f32]> {
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{what} is not contiguous")))?;
    match storage {
        Storage::Cpu(cpu) => Ok(&cpu.as_slice::<f32>()?[start..end]),
        _ => Err(Qwen2Error::Candle(candle_core::Error::Msg(format!(
            "{what} is not on the CPU"
        )))),
    }
}

const LANES: usize = 16;

/// `sum a[i] * b[i]` with 16 independent accumulators reduced in a fixed order: the compiler
/// vectorizes it without reassociating, so the result depends only on the inputs.
#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (xa, xb) in (&mut ca).zip(&mut cb) {
        for l in 0..LANES {
            acc[l] += xa[l] * xb[l];
        }
    }
    for (l, (x, y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
        acc[l] += x * y;
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0]
}

#[inline(always)]
fn axpy_lanes(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn axpy_avx2(alpha: f32, x: &[f32], y: &mut [f32]) {
    axpy_lanes(alpha, x, y)
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    static FLAG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FLAG.get_or_init(|| is_x86_feature_detected!("avx2"))
}

// The AVX2 builds compute the same operations in the same order (no FMA contraction), so
// both give identical bits; AVX2 only makes them wider.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 support was checked at run time.
        return unsafe { dot_avx2(a, b) };
    }
    dot_lanes(a, b)
}

pub(crate) fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 support was checked at run time.
        return unsafe { axpy_avx2(alpha, x, y) };
    }
    axpy_lanes(alpha, x, y)
}

/// `x [m, k]` times `w [n, k]` transposed, giving `[m, n]`; CPU f32, row-exact.
pub(crate) fn dense_matmul_t(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (m, k) = x.dims2()?;
    let (n, wk) = w.dims2()?;
    if k != wk {
        return Err(Qwen2Error::Candle(candle_core::Error::Msg(format!(
            "dense matmul: input [{m}, {k}] does not fit weight [{n}, {wk}]"
        ))));
    }
    let x = x.contiguous()?;
    let (x_storage, x_layout) = x.storage_and_layout();
    let (w_storage, w_layout) = w.storage_and_layout();
    let xs = cpu_slice(&x_storage, x_layout, "linear input")?;
    let ws = cpu_slice(&w_storage, w_layout, "linear weight")?;
    // Column-major first, so each weight row is read once for all input rows.
    let out_t = parallel_units(n, m, |j, col| {
        let w_row = &ws[j * k..(j + 1) * k];
        for (i, o) in col.iter_mut().enumerate() {
            *o = dot(&xs[i * k..(i + 1) * k], w_row);
        }
    });
    let mut out = vec![0f32; m * n];
    for (j, col) in out_t.chunks_exact(m).enumerate() {
        for (i, v) in col.iter().enumerate() {
            out[i * n + j] = *v;
        }
    }
    drop((x_storage, w_storage));
    Ok(Tensor::from_vec(out, (m, n), &Device::Cpu)?)
}

/// Runs `f(unit, out)` for every unit, each filling its own `width` floats of the result.
///
/// The work runs on candle's CPU worker pool, the one its matmuls use, so the two never
/// compete for cores. Results pass through relaxed atomic stores (plain stores on x86), which
/// lets disjoint units write one buffer without `unsafe`.
pub(crate) fn parallel_units(
    units: usize,
    width: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    let out: Vec<AtomicU32> = (0..units * width).map(|_| AtomicU32::new(0)).collect();
    candle_core::utils::barrier_pool().execute_chunked(units, |range| {
        let mut buf = vec![0f32; width];
        for unit in range {
            buf.fill(0.0);
            f(unit, &mut buf);
            for (slot, v) in out[unit * width..(unit + 1) * width].iter().zip(&buf) {
                slot.store(v.to_bits(), Ordering::Relaxed);
            }
        }
    });
    out.into_iter()
        .map(|a| f32::from_bits(a.into_inner()))
        .collect()
}
