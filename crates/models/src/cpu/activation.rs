//! Layer inputs quantized for the integer kernels: int8 codes with one f32 scale per block
//! (32 or 256 values) and the sums of each 16 codes, which the kernels need to take the
//! weights' zero points out of the integer dot products.
//!
//! Each row is quantized on its own, by the same operations whatever rows come with it.

use super::format::ActivationKind;
use super::isa::Isa;

/// Quantized rows `[rows, cols]`; the buffers are kept and reused across calls.
#[derive(Default)]
pub struct QuantizedRows {
    block: usize,
    rows: usize,
    cols: usize,
    q: Vec<i8>,
    d: Vec<f32>,
    sums16: Vec<i32>,
    /// 256-value blocks: the 32-value sums of each 64 values as two i16 in one i32.
    pairs32: Vec<i32>,
}

/// One quantized row, as the kernels read it.
#[derive(Clone, Copy)]
pub(crate) struct ActRow {
    pub q: *const i8,
    pub d: *const f32,
    pub sums16: *const i32,
    pub pairs32: *const i32,
    /// The f32 row (dense weights).
    pub x: *const f32,
}

impl ActRow {
    pub(crate) fn dense(x: *const f32) -> Self {
        Self {
            q: std::ptr::null(),
            d: std::ptr::null(),
            sums16: std::ptr::null(),
            pairs32: std::ptr::null(),
            x,
        }
    }
}

impl QuantizedRows {
    /// Quantizes `x` (`rows` rows of `cols`) with blocks of `kind.block()` values.
    pub fn quantize(&mut self, x: &[f32], rows: usize, cols: usize, kind: ActivationKind) {
        assert!(x.len() >= rows * cols);
        self.prepare(rows, cols, kind);
        let writer = self.writer();
        for r in 0..rows {
            // SAFETY: one row at a time, from the buffers just prepared.
            unsafe { writer.quantize(r, &x[r * cols..(r + 1) * cols]) };
        }
    }

    /// Sizes the buffers for `rows` rows of `cols` without filling them.
    pub(crate) fn prepare(&mut self, rows: usize, cols: usize, kind: ActivationKind) {
        let block = kind.block();
        assert!(
            block >= 16 && cols.is_multiple_of(block),
            "{cols} values in blocks of {block}"
        );
        self.block = block;
        self.rows = rows;
        self.cols = cols;
        self.q.resize(rows * cols, 0);
        self.d.resize(rows * cols / block, 0.0);
        self.sums16.resize(rows * cols / 16, 0);
        let paired = if block == 256 { rows * cols } else { 0 };
        self.pairs32.resize(paired / 64, 0);
    }

    /// A writer that quantizes rows of the prepared buffers from several threads.
    pub(crate) fn writer(&mut self) -> RowWriter {
        RowWriter {
            q: self.q.as_mut_ptr(),
            d: self.d.as_mut_ptr(),
            sums16: self.sums16.as_mut_ptr(),
            pairs32: self.pairs32.as_mut_ptr(),
            cols: self.cols,
            block: self.block,
            rows: self.rows,
        }
    }

    pub(crate) fn row(&self, r: usize) -> ActRow {
        let (cols, block) = (self.cols, self.block);
        ActRow {
            q: self.q[r * cols..].as_ptr(),
            d: self.d[r * cols / block..].as_ptr(),
            sums16: self.sums16[r * cols / 16..].as_ptr(),
            pairs32: self
                .pairs32
                .get(r * cols / 64..)
                .map_or(std::ptr::null(), |p| p.as_ptr()),
            x: std::ptr::null(),
        }
    }
}

/// Raw access to prepared buffers, for filling rows from several threads.
pub(crate) struct RowWriter {
    q: *mut i8,
    d: *mut f32,
    sums16: *mut i32,
    pairs32: *mut i32,
    cols: usize,
    block: usize,
    rows: usize,
}

// SAFETY: callers give each row to one thread (see `quantize`).
unsafe impl Sync for RowWriter {}

impl RowWriter {
    /// Quantizes row `r` from `x`.
    ///
    /// # Safety
    /// No other thread may write row `r` meanwhile, and the buffers must outlive the writer.
    pub(crate) unsafe fn quantize(&self, r: usize, x: &[f32]) {
        assert!(r < self.rows && x.len() >= self.cols);
        let (cols, block) = (self.cols, self.block);
        let q = std::slice::from_raw_parts_mut(self.q.add(r * cols), cols);
        let d = std::slice::from_raw_parts_mut(self.d.add(r * cols / block), cols / block);
        let sums = std::slice::from_raw_parts_mut(self.sums16.add(r * cols / 16), cols / 16);
        quantize_for_isa(&x[..cols], block, q, d, sums);
        if block == 256 {
            let pair = |a: i32, b: i32| (a as u16 as u32 | ((b as u16 as u32) << 16)) as i32;
            let p32 = std::slice::from_raw_parts_mut(self.pairs32.add(r * cols / 64), cols / 64);
            for (i, p) in p32.iter_mut().enumerate() {
                let s32 = |k: usize| sums[2 * k] + sums[2 * k + 1];
                *p = pair(s32(2 * i), s32(2 * i + 1));
            }
        }
    }
}

/// [`quantize_into`] compiled for the machine's vector width; the bits do not depend on it
/// (no fused operations).
fn quantize_for_isa(x: &[f32], block: usize, q: &mut [i8], d: &mut [f32], sums: &mut [i32]) {
    super::with_isa(Isa::active(), || quantize_into(x, block, q, d, sums))
}

/// `d = max|x| / 127`, `q = round(x / d)`, per block; sums of each 16 codes.
#[inline(always)]
fn quantize_into(x: &[f32], block: usize, q: &mut [i8], d: &mut [f32], sums: &mut [i32]) {
    for (b, xs) in x.chunks_exact(block).enumerate() {
        // Plain comparisons and integer rounding below: `f32::max`'s NaN rule and a saturating
        // float-to-int cast each keep these loops from vectorizing.
        let mut lanes = [0f32; 16];
        for chunk in xs.chunks_exact(16) {
            for (m, v) in lanes.iter_mut().zip(chunk) {
                *m = if v.abs() > *m { v.abs() } else { *m };
            }
        }
        let amax = lanes.iter().fold(0f32, |m, &v| if v > m { v } else { m });
        let qs = &mut q[b * block..(b + 1) * block];
        if amax == 0.0 || !amax.is_finite() {
            d[b] = if amax.is_finite() { 0.0 } else { amax };
            qs.fill(0);
        } else {
            d[b] = amax / 127.0;
            let inv = 127.0 / amax;
            for (o, v) in qs.iter_mut().zip(xs) {
                let scaled = v * inv;
                // NaN quantizes to 0, as a cast would take it.
                let scaled = if scaled.is_nan() { 0.0 } else { scaled };
                *o = super::ops::round_to_int(scaled).clamp(-127, 127) as i8;
            }
        }
        for (s, group) in sums[b * block / 16..(b + 1) * block / 16]
            .iter_mut()
            .zip(qs.chunks_exact(16))
        {
            *s = group.iter().map(|&v| v as i32).sum();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_scale_back_to_the_input() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let mut rows = QuantizedRows::default();
        rows.quantize(&x, 2, 256, ActivationKind::Q8Block32);
        for (i, v) in x.iter().enumerate() {
            let d = rows.d[i / 32];
            let back = rows.q[i] as f32 * d;
            assert!((back - v).abs() <= d / 2.0 + 1e-6, "{i}: {back} vs {v}");
        }
        let r = 1;
        let sum: i32 = rows.q[256 + 16..256 + 32].iter().map(|&v| v as i32).sum();
        assert_eq!(rows.sums16[r * 16 + 1], sum);
    }

    #[test]
    fn a_zero_block_has_zero_scale() {
        let mut rows = QuantizedRows::default();
        rows.quantize(&[0.0; 256], 1, 256, ActivationKind::Q8Block256);
        assert_eq!(rows.d[0], 0.0);
        assert!(rows.q.iter().all(|&v| v == 0));
    }
}
