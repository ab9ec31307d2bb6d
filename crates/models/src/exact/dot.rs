//! A fixed-order f32 dot product and axpy, fused and built for AVX2 where the CPU engine's
//! kernel set is (every x86 set but the portable one), plain elsewhere on x86.
//!
//! The lane structure is explicit (16 independent accumulators reduced in a fixed order), so
//! the compiler vectorizes without reassociating, and the result depends only on the inputs.

use crate::cpu::avx2_kernel;
use crate::cpu::ops::{reduce, LANES};
#[cfg(target_arch = "x86_64")]
use crate::cpu::Isa;

#[inline(always)]
fn dot_generic<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0f32; LANES];
    let chunks = n / LANES;
    for c in 0..chunks {
        let xa = &a[c * LANES..(c + 1) * LANES];
        let xb = &b[c * LANES..(c + 1) * LANES];
        for l in 0..LANES {
            acc[l] = if FMA {
                xa[l].mul_add(xb[l], acc[l])
            } else {
                acc[l] + xa[l] * xb[l]
            };
        }
    }
    for i in chunks * LANES..n {
        let l = i - chunks * LANES;
        acc[l] = if FMA {
            a[i].mul_add(b[i], acc[l])
        } else {
            acc[l] + a[i] * b[i]
        };
    }
    reduce(acc)
}

/// Four dot products against one shared vector `w`, each computed with exactly the lane
/// arithmetic of [`dot_generic`], so `dot4(x, w)[r] == dot(x[r], w)` bit for bit while `w` is
/// read once.
#[inline(always)]
fn dot4_generic<const FMA: bool>(x: [&[f32]; 4], w: &[f32]) -> [f32; 4] {
    let n = w.len();
    let mut acc = [[0f32; LANES]; 4];
    let chunks = n / LANES;
    for c in 0..chunks {
        let wc = &w[c * LANES..(c + 1) * LANES];
        for r in 0..4 {
            let xc = &x[r][c * LANES..(c + 1) * LANES];
            for l in 0..LANES {
                acc[r][l] = if FMA {
                    xc[l].mul_add(wc[l], acc[r][l])
                } else {
                    acc[r][l] + xc[l] * wc[l]
                };
            }
        }
    }
    for i in chunks * LANES..n {
        let l = i - chunks * LANES;
        for r in 0..4 {
            acc[r][l] = if FMA {
                x[r][i].mul_add(w[i], acc[r][l])
            } else {
                acc[r][l] + x[r][i] * w[i]
            };
        }
    }
    acc.map(reduce)
}

#[inline(always)]
fn axpy_generic<const FMA: bool>(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = if FMA {
            alpha.mul_add(*xi, *yi)
        } else {
            *yi + alpha * *xi
        };
    }
}

avx2_kernel! {
    unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
        dot_generic::<true>(a, b)
    }
}

avx2_kernel! {
    unsafe fn dot4_avx2(x: [&[f32]; 4], w: &[f32]) -> [f32; 4] {
        dot4_generic::<true>(x, w)
    }
}

avx2_kernel! {
    unsafe fn axpy_avx2(alpha: f32, x: &[f32], y: &mut [f32]) {
        axpy_generic::<true>(alpha, x, y)
    }
}

/// Whether the CPU engine's kernel set ([`Isa::active`], the one run-time choice of CPU
/// features) is an x86 set beyond the portable one, all of which include AVX2's features.
#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    use std::sync::OnceLock;
    static FLAG: OnceLock<bool> = OnceLock::new();
    *FLAG.get_or_init(|| {
        let isa = Isa::active();
        isa != Isa::Portable && isa.supported()
    })
}

/// `sum_i a[i] * b[i]` over the common length, in a fixed order.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the active kernel set is supported and includes AVX2, FMA and F16C.
        return unsafe { dot_avx2(a, b) };
    }
    #[cfg(target_arch = "aarch64")]
    return dot_generic::<true>(a, b);
    #[allow(unreachable_code)]
    dot_generic::<false>(a, b)
}

/// `[dot(x[0], w), .., dot(x[3], w)]`, bit-identical to four [`dot`] calls; every `x[r]` must
/// be as long as `w`.
#[inline]
pub fn dot4(x: [&[f32]; 4], w: &[f32]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the active kernel set is supported and includes AVX2, FMA and F16C.
        return unsafe { dot4_avx2(x, w) };
    }
    #[cfg(target_arch = "aarch64")]
    return dot4_generic::<true>(x, w);
    #[allow(unreachable_code)]
    dot4_generic::<false>(x, w)
}

/// `y += alpha * x`, element by element.
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the active kernel set is supported and includes AVX2, FMA and F16C.
        return unsafe { axpy_avx2(alpha, x, y) };
    }
    #[cfg(target_arch = "aarch64")]
    return axpy_generic::<true>(alpha, x, y);
    #[allow(unreachable_code)]
    axpy_generic::<false>(alpha, x, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_naive_sum() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.25).collect();
        let naive: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (*x as f64) * (*y as f64))
            .sum();
        assert!((dot(&a, &b) as f64 - naive).abs() < 1e-3);
    }

    #[test]
    fn dot4_is_four_dots_bit_for_bit() {
        for n in [1usize, 15, 16, 17, 64, 100, 1031] {
            let w: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 113) as f32 / 37.0 - 1.3)
                .collect();
            let xs: Vec<Vec<f32>> = (0..4)
                .map(|r| {
                    (0..n)
                        .map(|i| ((i * 31 + r * 17) % 97) as f32 / 19.0 - 2.1)
                        .collect()
                })
                .collect();
            let got = dot4([&xs[0], &xs[1], &xs[2], &xs[3]], &w);
            for r in 0..4 {
                assert_eq!(got[r].to_bits(), dot(&xs[r], &w).to_bits(), "n {n} row {r}");
            }
        }
    }

    #[test]
    fn axpy_adds_scaled() {
        let mut y = vec![1.0f32; 5];
        axpy(2.0, &[1.0, 2.0, 3.0, 4.0, 5.0], &mut y);
        assert_eq!(y, vec![3.0, 5.0, 7.0, 9.0, 11.0]);
    }
}
