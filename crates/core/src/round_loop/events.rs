//! What the round loop reports to its caller.

use std::future::Future;

use crate::finish::FinishReason;
use crate::sampling::TokenLogprob;
use crate::stats::SpecStats;

/// Tokens emitted by one step (the prefill or one round), with their text.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenDelta {
    /// Output index of the first token here (the prefill token has index 0).
    pub first_index: u64,
    /// Emitted token ids, in order; the last one may be the token that ended generation.
    pub tokens: Vec<u32>,
    /// Text that became safe to show with these tokens (possibly empty, see
    /// [`crate::stop::StopChecker`]).
    pub text: String,
    /// The log probability of each token, when the request asked for them.
    pub logprobs: Vec<TokenLogprob>,
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finish {
    /// Why generation ended.
    pub reason: FinishReason,
    /// Tokens emitted in total.
    pub tokens_emitted: usize,
    /// Speculative statistics of the request.
    pub stats: SpecStats,
}

/// One message to the caller.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// New tokens and text.
    Tokens(TokenDelta),
    /// The last event of a successful request.
    Finished(Finish),
}

/// Where events go. A closed sink cancels the request.
pub trait EventSink: Send {
    /// Delivers one event, waiting for room if the sink applies back-pressure.
    fn send(&mut self, event: Event) -> impl Future<Output = Result<(), SinkClosed>> + Send;
}

/// The receiver of the events is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("event receiver is gone")]
pub struct SinkClosed;

/// Collects every event (unary calls, tests).
impl EventSink for Vec<Event> {
    fn send(&mut self, event: Event) -> impl Future<Output = Result<(), SinkClosed>> + Send {
        self.push(event);
        std::future::ready(Ok(()))
    }
}
