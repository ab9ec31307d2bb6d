//! What one target forward costs as a function of the tokens in it (all rows together),
//! learned from the forwards the verifier reports.

use std::time::Duration;

use super::cost_estimates::seconds;

/// Largest forward size with its own estimate; larger forwards count at this size, which
/// keeps the table bounded whatever the load.
pub const MAX_TRACKED_TOKENS: usize = 1024;

/// Running estimate of seconds per forward, by tokens in the forward.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ForwardCurve {
    /// `(tokens, mean seconds)`, ascending by tokens; only measured sizes.
    points: Vec<(usize, f64)>,
}

impl ForwardCurve {
    /// Records a forward of `tokens` tokens that took `time`; `weight` in `(0, 1]` is how much
    /// the sample moves the estimate at that size.
    pub fn record(&mut self, tokens: usize, time: Duration, weight: f64) {
        if tokens == 0 {
            return;
        }
        let tokens = tokens.min(MAX_TRACKED_TOKENS);
        let sample = seconds(time);
        match self.points.binary_search_by_key(&tokens, |&(size, _)| size) {
            Ok(at) => {
                let mean = &mut self.points[at].1;
                *mean += weight * (sample - *mean);
            }
            Err(at) => self.points.insert(at, (tokens, sample)),
        }
    }

    /// Seconds of a forward of `tokens` tokens: measured, else interpolated between the
    /// nearest measured sizes, else extrapolated along the slope of the two largest (never
    /// downward); a size below every measured one gets the smallest's cost. `None` before
    /// any forward was measured.
    pub fn seconds(&self, tokens: usize) -> Option<f64> {
        along(&self.points, tokens.max(1))
    }

    /// Distinct sizes measured.
    pub fn sizes(&self) -> usize {
        self.points.len()
    }
}

/// The value at `at` of a curve known at `points` (sizes ascending): the point itself, else
/// interpolated between the nearest two, else extrapolated along the slope of the two
/// largest (never downward); below every point, the smallest's value. `None` without points.
pub(super) fn along(points: &[(usize, f64)], at: usize) -> Option<f64> {
    let below = points.iter().rev().find(|&&(size, _)| size <= at);
    let above = points.iter().find(|&&(size, _)| size >= at);
    Some(match (below, above) {
        (None, None) => return None,
        (Some(&(size, value)), _) if size == at => value,
        (Some(&(low, low_value)), Some(&(high, high_value))) => {
            let t = (at - low) as f64 / (high - low) as f64;
            low_value + t * (high_value - low_value)
        }
        (None, Some(&(_, value))) => value,
        (Some(&(last, last_value)), None) => match points.len().checked_sub(2) {
            Some(i) => {
                let (prev, prev_value) = points[i];
                let slope = ((last_value - prev_value) / (last - prev) as f64).max(0.0);
                last_value + slope * (at - last) as f64
            }
            None => last_value,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::block_size::test_time::{close, ms};

    #[test]
    fn knows_nothing_before_a_forward() {
        assert_eq!(ForwardCurve::default().seconds(4), None);
    }

    #[test]
    fn interpolates_and_extrapolates_along_the_last_slope() {
        let mut curve = ForwardCurve::default();
        curve.record(1, ms(100), 1.0);
        curve.record(5, ms(180), 1.0);
        assert!(close(curve.seconds(1), 0.100));
        assert!(close(curve.seconds(3), 0.140));
        assert!(close(curve.seconds(9), 0.260));
        curve.record(2, ms(110), 1.0);
        assert!(close(curve.seconds(0), 0.100));
    }

    #[test]
    fn a_single_point_is_flat_and_a_falling_slope_is_not_followed() {
        let mut curve = ForwardCurve::default();
        curve.record(4, ms(100), 1.0);
        assert!(close(curve.seconds(1), 0.100));
        assert!(close(curve.seconds(40), 0.100));
        curve.record(8, ms(90), 1.0);
        assert!(close(curve.seconds(16), 0.090));
    }

    #[test]
    fn samples_are_averaged_and_huge_forwards_bounded() {
        let mut curve = ForwardCurve::default();
        curve.record(2, ms(100), 0.5);
        curve.record(2, ms(200), 0.5);
        assert!(close(curve.seconds(2), 0.150));
        curve.record(100_000, ms(1000), 1.0);
        assert!(curve.points.iter().all(|&(k, _)| k <= MAX_TRACKED_TOKENS));
        curve.record(0, ms(5), 1.0);
        assert_eq!(curve.points.len(), 2);
    }
}
