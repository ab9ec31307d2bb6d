//! `--draft-weights`: the precision a GGUF draft model's matrices run in.

use specd_models::MatrixPrecision;

/// How a GGUF draft model's matrices are held on the CPU engine. The target checks every
/// proposal, so this changes only how many are accepted and what a draft step costs, never
/// the output; the target always runs as its file stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DraftWeights {
    /// As the file stores them.
    #[default]
    Stored,
    /// Matrices stored wider than 4.5 bits a weight (Q5_0, Q6_K, Q8_0, F16...) re-encoded
    /// to Q4_K or Q4_0 at load: fewer bytes streamed per draft step.
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
