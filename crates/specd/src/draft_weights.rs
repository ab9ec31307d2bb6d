//! `--draft-weights`: the precision a GGUF draft model's matrices run in.

use specd_models::MatrixPrecision;

/// How a GGUF draft model's matrices are held on the CPU engine. The target checks every
/// proposal, so this changes only how many are accepted and what a draft step costs, never
/// the output; the target always runs as its file stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DraftWeights {
    /// As the file stores them.
    Stored,
    /// Matrices stored wider than 4.5 bits a weight (Q5_0, Q6_K, Q8_0, F16...) re-encoded
    /// to Q4_K or Q4_0 at load: fewer bytes streamed per draft step. The default: on the
    /// Qwen2.5-Coder pair the 0.5B's step costs 0.25-0.26 target steps instead of 0.32-0.33,
    /// and each draft is accepted about as often (BENCHMARKS.md).
    #[default]
    Q4,
}

impl From<DraftWeights> for MatrixPrecision {
    fn from(weights: DraftWeights) -> Self {
        match weights {
            DraftWeights::Stored => Self::Stored,
            DraftWeights::Q4 => Self::FourBit,
        }
    }
}
