//! Durations and comparisons the block-size tests share.

use std::time::Duration;

pub(super) fn ms(value: u64) -> Duration {
    Duration::from_millis(value)
}

/// `a` is within 1e-9 of `b`.
pub(super) fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}
