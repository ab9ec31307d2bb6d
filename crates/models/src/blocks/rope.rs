//! Rotary position embedding in the halves layout (rows `i` and `i + head_dim / 2` of a head
//! rotate together): one table of angles per position, however a family derives them.
//!
//! Angles are computed per token from its absolute position, so every row of a batch can sit
//! at its own position and a token's rotation never depends on the block it arrived in.

use candle_core::{DType, Device, Tensor};

/// The angle per position of each rotated pair, in the precision the family's reference
/// computes it in, so that positions map to the reference's angles bit for bit.
#[derive(Debug, Clone)]
pub enum RotaryTable {
    /// Frequencies and angles in f32 (transformers' RoPE).
    F32(Vec<f32>),
    /// Frequencies and angles in f64, rounded to f32 at the end.
    F64(Vec<f64>),
}

impl RotaryTable {
    /// Rotated pairs: `head_dim / 2`.
    pub fn pairs(&self) -> usize {
        match self {
            Self::F32(f) => f.len(),
            Self::F64(f) => f.len(),
        }
    }

    /// Sets `cos` and `sin` to `[positions, pairs]`, row-major.
    pub fn fill(
        &self,
        positions: impl IntoIterator<Item = usize>,
        cos: &mut Vec<f32>,
        sin: &mut Vec<f32>,
    ) {
        cos.clear();
        sin.clear();
        for p in positions {
            match self {
                Self::F32(freqs) => {
                    for &f in freqs {
                        let angle = p as f32 * f;
                        cos.push(angle.cos());
                        sin.push(angle.sin());
                    }
                }
                Self::F64(freqs) => {
                    for &f in freqs {
                        let angle = p as f64 * f;
                        cos.push(angle.cos() as f32);
                        sin.push(angle.sin() as f32);
                    }
                }
            }
        }
    }

    /// `cos`, `sin` of `positions` as `[positions, pairs]` tensors of `dtype` on `device`.
    pub fn tensors(
        &self,
        positions: &[usize],
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        self.fill(positions.iter().copied(), &mut cos, &mut sin);
        let shape = (positions.len(), self.pairs());
        Ok((
            Tensor::from_vec(cos, shape, device)?.to_dtype(dtype)?,
            Tensor::from_vec(sin, shape, device)?.to_dtype(dtype)?,
        ))
    }
}

/// Rotates `x [tokens, heads, head_dim]` by the tables of its tokens (`[tokens, pairs]`).
pub fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let x4 = x.unsqueeze(0)?.contiguous()?;
    candle_nn::rotary_emb::rope_thd(&x4, cos, sin)?.squeeze(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_precision_gives_its_own_angles() {
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        RotaryTable::F32(vec![1.0, 0.01]).fill([0, 3], &mut cos, &mut sin);
        assert_eq!(cos, [1.0, 1.0, 3f32.cos(), (3f32 * 0.01).cos()]);
        assert_eq!(sin[3], (3f32 * 0.01).sin());
        RotaryTable::F64(vec![0.01]).fill([3], &mut cos, &mut sin);
        assert_eq!(cos, [(3f64 * 0.01).cos() as f32]);
        assert_eq!(sin, [(3f64 * 0.01).sin() as f32]);
    }

    #[test]
    fn rotating_a_token_turns_each_pair_by_its_angle() {
        let table = RotaryTable::F32(vec![0.5]);
        let (cos, sin) = table.tensors(&[2], DType::F32, &Device::Cpu).unwrap();
        let x = Tensor::new(&[[[1f32, 0.0]]], &Device::Cpu).unwrap();
        let y: Vec<f32> = rotate(&x, &cos, &sin)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let (c, s) = (1f32.cos(), 1f32.sin());
        assert!((y[0] - c).abs() < 1e-6 && (y[1] - s).abs() < 1e-6, "{y:?}");
    }
}
