//! Record of a request leaving speculative decoding because its drafter failed.

/// What went wrong with the drafter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallbackCause {
    /// Opening the drafter session failed.
    Open,
    /// A draft call failed.
    Draft,
    /// A draft call answered with more tokens than asked for.
    InvalidDraft,
    /// The verifier gave no carry for the drafter although one was asked for.
    MissingCarry,
}

impl FallbackCause {
    /// Short stable label, fit for metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            FallbackCause::Open => "open",
            FallbackCause::Draft => "draft",
            FallbackCause::InvalidDraft => "invalid_draft",
            FallbackCause::MissingCarry => "missing_carry",
        }
    }
}

/// The request switched to plain decoding (K = 0) at `round`; output is unaffected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrafterFallback {
    /// Round in which the drafter failed (0 for a failed open).
    pub round: u32,
    /// What failed.
    pub cause: FallbackCause,
    /// The drafter's error message.
    pub message: String,
}
