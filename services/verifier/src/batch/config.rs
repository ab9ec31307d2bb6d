//! How the batch scheduler forms its forwards.

use std::time::Duration;

/// Limits of one batched forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    /// Sequences (rows) one forward runs at most.
    pub max_rows: usize,
    /// How long the first waiting row waits for others to join before its forward runs.
    pub max_wait: Duration,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_rows: 16,
            max_wait: Duration::from_micros(1000),
        }
    }
}
