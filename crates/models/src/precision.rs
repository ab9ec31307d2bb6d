//! The precision a model's matrices run in on the CPU engine.

use crate::cpu::WeightFormat;

/// How many bits a weight the engine's matrices hold.
///
/// A decode step streams every matrix once, so a draft model's step costs its matrices'
/// bytes. Its proposals are checked by the target, so running it narrower than its file can
/// change how many of them are accepted, never what is emitted: targets always run as
/// stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MatrixPrecision {
    /// As the file stores them (formats without a kernel re-encoded to Q8_0).
    #[default]
    Stored,
    /// Matrices stored wider than 4.5 bits a weight re-encoded at load to 4.5: Q4_K where
    /// rows are whole 256-value blocks, Q4_0 where they are whole 32-value blocks (the
    /// 896-wide rows of Qwen2.5 0.5B, which its files keep in Q5_0 and Q8_0).
    FourBit,
}

impl MatrixPrecision {
    /// The format a matrix stored as `format`, with rows of `inp` values, is re-encoded to;
    /// `None` keeps it.
    pub(crate) fn narrower(self, format: WeightFormat, inp: usize) -> Option<WeightFormat> {
        match self {
            Self::Stored => None,
            Self::FourBit => {
                let four = if inp.is_multiple_of(WeightFormat::Q4K.block_len()) {
                    WeightFormat::Q4K
                } else if inp.is_multiple_of(WeightFormat::Q4_0.block_len()) {
                    WeightFormat::Q4_0
                } else {
                    return None;
                };
                (bits_per_weight(format) > bits_per_weight(four)).then_some(four)
            }
        }
    }
}

fn bits_per_weight(format: WeightFormat) -> f64 {
    (format.block_bytes() * 8) as f64 / format.block_len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_bit_narrows_only_wider_formats_and_keeps_rows_whole() {
        let four = MatrixPrecision::FourBit;
        assert_eq!(
            four.narrower(WeightFormat::Q5_0, 896),
            Some(WeightFormat::Q4_0)
        );
        assert_eq!(
            four.narrower(WeightFormat::Q8_0, 896),
            Some(WeightFormat::Q4_0)
        );
        assert_eq!(
            four.narrower(WeightFormat::Q6K, 4864),
            Some(WeightFormat::Q4K)
        );
        assert_eq!(
            four.narrower(WeightFormat::F16, 1536),
            Some(WeightFormat::Q4K)
        );
        assert_eq!(four.narrower(WeightFormat::Q4K, 4864), None);
        assert_eq!(four.narrower(WeightFormat::Q4_0, 512), None);
        assert_eq!(four.narrower(WeightFormat::F32, 40), None);
        for format in [WeightFormat::Q5_0, WeightFormat::Q8_0, WeightFormat::F32] {
            assert_eq!(MatrixPrecision::Stored.narrower(format, 896), None);
        }
    }
}
