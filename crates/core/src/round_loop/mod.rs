//! The per-request round state machine, generic over the verifier and drafter sides.

mod answer_check;
mod cleanup;
mod clock;
mod control;
mod error;
mod events;
mod observe;
mod request;
mod run;

pub use clock::{Clock, SystemClock};
pub use control::RequestControl;
pub use error::RoundLoopError;
pub use events::{Event, EventSink, Finish, SinkClosed, TokenDelta};
pub use request::{GenerationRequest, RequestError};
pub use run::RoundLoop;
