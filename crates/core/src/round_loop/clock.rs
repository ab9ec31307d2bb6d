//! Where the round loop reads the time it measures draft and verify calls with.

use std::time::Instant;

/// A monotonic clock. The default is the system clock; an async runtime with a virtual
/// clock (tokio's paused time, for example) can supply its own so measured costs follow it.
pub trait Clock: Send + Sync {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// [`Instant::now`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}
