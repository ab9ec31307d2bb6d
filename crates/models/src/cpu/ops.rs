//! Element-wise and per-row operations of a decoder layer, each with one fixed order of
//! float operations (explicit lane structure; separate multiplies and adds, which Rust never
//! fuses), so a row's result never depends on the rows beside it or on the instruction set,
//! and no CPU needs a software fused multiply-add.

/// Independent accumulators of a fixed-order reduction (see [`reduce`]).
pub(crate) const LANES: usize = 16;

/// `sum a[i] * b[i]`: 16 lane accumulators, reduced pairwise.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a[..n].chunks_exact(LANES), b[..n].chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (xa, xb) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += xa[l] * xb[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        acc[l] += x * y;
    }
    reduce(acc)
}

/// Sums 16 lanes pairwise, in a fixed order: the one reduction of every fixed-order dot
/// product (the CPU engine's and the exact kernels'), so their results depend only on the
/// inputs.
#[inline(always)]
pub(crate) fn reduce(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0]
}

/// `v` rounded to the nearest integer, ties to even, for `|v| < 2^22`: adding and
/// subtracting 1.5 * 2^23 leaves no fraction bits (no rounding instruction needed).
#[inline(always)]
pub fn round_even(v: f32) -> f32 {
    (v + ROUND_MAGIC) - ROUND_MAGIC
}

/// `round_even(v)` as an integer, for `|v| < 2^22`, read from the bits of `v + ROUND_MAGIC`
/// (no saturating cast, so loops of it vectorize).
#[inline(always)]
pub fn round_to_int(v: f32) -> i32 {
    (v + ROUND_MAGIC).to_bits() as i32 - ROUND_MAGIC.to_bits() as i32
}

/// 1.5 * 2^23: below `|v| < 2^22`, `v + ROUND_MAGIC` holds `round(v)` in its low mantissa
/// bits, its bits those of `ROUND_MAGIC` plus `round(v)`.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// `out = x / sqrt(mean(x^2) + eps) * weight`.
#[inline(always)]
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let ss = dot(x, x);
    let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * inv * w;
    }
}

/// `e^x` for `x` in about [-87, 88] (clamped outside), within a few ulp: Cody-Waite
/// reduction (the `ln 2` split keeps `n * LN2_HI` exact) and a degree-6 polynomial.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let n = round_even(x * std::f32::consts::LOG2_E);
    let r = x - n * 0.693_145_75;
    let r = r - n * 1.428_606_8e-6;
    let mut p = 1.0 / 720.0f32;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    // 2^n from `n` as an integer (-126..=127 under the clamp) read from its bits: a
    // float-to-int cast would saturate, which keeps loops of this from vectorizing.
    let scale = f32::from_bits(((round_to_int(n) + 127) as u32) << 23);
    p * scale
}

/// `x += y`.
#[inline(always)]
pub fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Rotates each head of `x` (NeoX layout: the halves of a head rotate together) by the
/// angles whose cosines and sines are `cos`, `sin` (`head_dim / 2` each).
#[inline(always)]
pub fn rope(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        let (a, b) = head.split_at_mut(half);
        for i in 0..half {
            let (x0, x1) = (a[i], b[i]);
            a[i] = x0 * cos[i] - x1 * sin[i];
            b[i] = x0 * sin[i] + x1 * cos[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_close_to_std() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let ours = exp(x) as f64;
            let exact = (x as f64).exp();
            worst = worst.max(((ours - exact) / exact).abs());
            x += 0.0137;
        }
        assert!(worst < 5e-7, "relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-200.0) < 1e-37);
    }

    #[test]
    fn round_to_int_is_round_even() {
        for i in -40_000..40_000 {
            let v = i as f32 * 0.003_17;
            assert_eq!(round_to_int(v) as f32, round_even(v), "{v}");
        }
        for v in [0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -127.49, 127.0] {
            assert_eq!(round_to_int(v) as f32, round_even(v), "{v}");
        }
    }

    #[test]
    fn round_even_rounds_ties_to_even() {
        for (v, want) in [
            (0.5, 0.0),
            (1.5, 2.0),
            (2.5, 2.0),
            (-0.5, -0.0),
            (-1.5, -2.0),
            (3.7, 4.0),
            (-126.4, -126.0),
        ] {
            assert_eq!(round_even(v), want, "{v}");
        }
    }

    #[test]
    fn dot_matches_f64() {
        let a: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..100).map(|i| (i as f32 * 0.11).cos()).collect();
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - exact).abs() < 1e-5);
    }
}
