//! Why a request stopped generating.

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// `max_tokens` tokens were emitted.
    Length,
    /// An end-of-sequence token was emitted (and `ignore_eos` was off).
    Eos,
    /// A stop token or stop string was produced.
    Stop,
    /// The caller cancelled the request or stopped listening.
    Cancelled,
}

impl FinishReason {
    /// Short stable label (`"length"`, `"eos"`, `"stop"`, `"cancelled"`).
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Eos => "eos",
            FinishReason::Stop => "stop",
            FinishReason::Cancelled => "cancelled",
        }
    }
}
