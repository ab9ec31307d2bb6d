//! A fixed-order f32 dot product and axpy, with a runtime-selected AVX2+FMA build.
//!
//! The lane structure is explicit (16 independent accumulators reduced in a fixed order), so
//! the compiler vectorizes without reassociating, and the result depends only on the inputs.

const LANES: usize = 16;

#[inline(always)]
fn dot_generic<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0f32; LANES];
    let chunks = n / LANES;
    for c in 0..chunks {
        let xa = &a[c * LANES..(c + 1) * LANES];
        let xb = &b[c * LANES..(c + 1) * LANES];
        for l in 0..LANES {
            acc[l] = if FMA { xa[l].mul_add(xb[l], acc[l]) } else { acc[l] + xa[l] * xb[l] };
        }
    }
    for i in chunks * LANES..n {
        let l = i - chunks * LANES;
        acc[l] = if FMA { a[i].mul_add(b[i], acc[l]) } else { acc[l] + a[i] * b[i] };
    }
    // Pairwise reduction in a fixed order.
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
fn axpy_generic<const FMA: bool>(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = if FMA { alpha.mul_add(*xi, *yi) } else { *yi + alpha * *xi };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_generic::<true>(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(alpha: f32, x: &[f32], y: &mut [f32]) {
    axpy_generic::<true>(alpha, x, y)
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    use std::sync::OnceLock;
    static FLAG: OnceLock<bool> = OnceLock::new();
    *FLAG.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

/// `sum_i a[i] * b[i]` over the common length, in a fixed order.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
        return unsafe { dot_avx2(a, b) };
    }
    #[cfg(target_arch = "aarch64")]
    return dot_generic::<true>(a, b);
    #[allow(unreachable_code)]
    dot_generic::<false>(a, b)
}

/// `y += alpha * x`, element by element.
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
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
        let naive: f64 = a.iter().zip(&b).map(|(x, y)| (*x as f64) * (*y as f64)).sum();
        assert!((dot(&a, &b) as f64 - naive).abs() < 1e-3);
    }

    #[test]
    fn axpy_adds_scaled() {
        let mut y = vec![1.0f32; 5];
        axpy(2.0, &[1.0, 2.0, 3.0, 4.0, 5.0], &mut y);
        assert_eq!(y, vec![3.0, 5.0, 7.0, 9.0, 11.0]);
    }
}
