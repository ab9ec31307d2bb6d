//! Running estimates of what a round costs and yields, for the cost-aware block size.
//!
//! Every estimate is an exponentially weighted moving average, so it follows a drafter or a
//! device whose speed changes during a request. Times are kept in seconds as `f64`.

use std::time::Duration;

use super::forward_curve::along;

/// Largest block size (and draft position) with its own estimate; larger ones reuse the
/// estimates at this size, which keeps memory bounded whatever a request asks for.
pub const MAX_TRACKED_BLOCK: usize = 64;
/// Samples longer than this are clamped: a stalled call (or a clock that jumped) then moves
/// an estimate a lot but cannot make it infinite.
pub const MAX_SAMPLE: Duration = Duration::from_secs(60);

/// One exponentially weighted moving average; empty until its first sample.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Ewma(pub(super) Option<f64>);

impl Ewma {
    pub(super) fn update(&mut self, sample: f64, weight: f64) {
        self.0 = Some(match self.0 {
            None => sample,
            Some(value) => value + weight * (sample - value),
        });
    }
}

/// `time` in seconds, clamped to [`MAX_SAMPLE`].
pub(super) fn seconds(time: Duration) -> f64 {
    time.min(MAX_SAMPLE).as_secs_f64()
}

/// Draft step cost, verify cost by block size and acceptance by draft position.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CostEstimates {
    draft_step: Ewma,
    draft_samples: u64,
    /// `verify[bs - 1]`: seconds of one verify call of `bs` tokens.
    verify: Vec<Ewma>,
    /// `acceptance[i - 1]`: probability that draft `i` is accepted given drafts `1..i` were.
    acceptance: Vec<Ewma>,
}

impl CostEstimates {
    /// Records a draft call of `steps` drafts that took `time`; `weight` in `(0, 1]` is how
    /// much the sample moves the estimate.
    pub fn record_draft(&mut self, steps: usize, time: Duration, weight: f64) {
        if steps == 0 {
            return;
        }
        self.draft_step.update(seconds(time) / steps as f64, weight);
        self.draft_samples += 1;
    }

    /// Records a verify call of `block` tokens (bonus included) that took `time`.
    pub fn record_verify(&mut self, block: usize, time: Duration, weight: f64) {
        if block == 0 {
            return;
        }
        let index = block.min(MAX_TRACKED_BLOCK) - 1;
        if self.verify.len() <= index {
            self.verify.resize(index + 1, Ewma::default());
        }
        self.verify[index].update(seconds(time), weight);
    }

    /// Records a round that verified `drafted` drafts and accepted the first `accepted`:
    /// position `i` is observed when drafts `1..i` were accepted.
    pub fn record_acceptance(&mut self, drafted: usize, accepted: usize, weight: f64) {
        let observed = drafted.min(accepted + 1).min(MAX_TRACKED_BLOCK);
        if self.acceptance.len() < observed {
            self.acceptance.resize(observed, Ewma::default());
        }
        for (index, estimate) in self.acceptance[..observed].iter_mut().enumerate() {
            let hit = if index < accepted { 1.0 } else { 0.0 };
            estimate.update(hit, weight);
        }
    }

    /// Records whether draft `position` (from 1) was accepted in a round that accepted
    /// every draft before it.
    pub fn record_position(&mut self, position: usize, hit: bool, weight: f64) {
        let Some(index) = position.min(MAX_TRACKED_BLOCK).checked_sub(1) else {
            return;
        };
        if self.acceptance.len() <= index {
            self.acceptance.resize(index + 1, Ewma::default());
        }
        self.acceptance[index].update(if hit { 1.0 } else { 0.0 }, weight);
    }

    /// Sets the acceptance of draft positions `1..=rates.len()` (each a probability), as
    /// if measured: a request starts from what earlier requests showed.
    pub fn seed_acceptance(&mut self, rates: &[f64]) {
        self.acceptance = rates
            .iter()
            .take(MAX_TRACKED_BLOCK)
            .map(|&rate| Ewma(Some(rate.clamp(0.0, 1.0))))
            .collect();
    }

    /// Seconds per draft step, once measured.
    pub fn draft_step(&self) -> Option<f64> {
        self.draft_step.0
    }

    /// Draft calls measured so far.
    pub fn draft_samples(&self) -> u64 {
        self.draft_samples
    }

    /// Whether a verify of exactly `block` tokens was measured.
    pub fn has_verify(&self, block: usize) -> bool {
        block >= 1 && self.measured_verify(block).is_some()
    }

    fn measured_verify(&self, block: usize) -> Option<f64> {
        self.verify
            .get(block.min(MAX_TRACKED_BLOCK).checked_sub(1)?)
            .and_then(|e| e.0)
    }

    /// Seconds of a verify of `block` tokens: measured, else interpolated between the nearest
    /// measured sizes, else extrapolated along the slope of the two largest (never downward),
    /// and never below the one-token cost. A size below every measured one gets the smallest
    /// measured cost. `None` before any verify was measured.
    pub fn verify(&self, block: usize) -> Option<f64> {
        let block = block.clamp(1, MAX_TRACKED_BLOCK);
        let points: Vec<(usize, f64)> = (1..=self.verify.len())
            .filter_map(|size| self.measured_verify(size).map(|v| (size, v)))
            .collect();
        let estimate = along(&points, block)?;
        let floor = self.measured_verify(1).unwrap_or(0.0);
        Some(estimate.max(floor))
    }

    /// Probability that draft `position` (from 1) is accepted given the earlier ones were;
    /// a position never observed takes the nearest observed one below it.
    pub fn acceptance(&self, position: usize) -> Option<f64> {
        let upto = position
            .clamp(1, MAX_TRACKED_BLOCK)
            .min(self.acceptance.len());
        self.acceptance[..upto]
            .iter()
            .rev()
            .find_map(|e| e.0)
            .map(|p| p.clamp(0.0, 1.0))
    }

    /// Expected tokens a round of `block` emits: `1 + Σ_{i<block} Π_{j≤i} p_j`.
    pub fn expected_emitted(&self, block: usize) -> Option<f64> {
        let mut expected = 1.0;
        let mut reach = 1.0;
        for position in 1..block {
            reach *= self.acceptance(position)?;
            expected += reach;
        }
        Some(expected)
    }

    /// Expected seconds per emitted token of a round of `block`:
    /// `(draft_step × (block − 1) + verify(block)) / expected_emitted(block)`.
    pub fn cost_per_token(&self, block: usize) -> Option<f64> {
        let block = block.max(1);
        let drafting = match block {
            1 => 0.0,
            _ => self.draft_step()? * (block - 1) as f64,
        };
        Some((drafting + self.verify(block)?) / self.expected_emitted(block)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::block_size::test_time::{close, ms};

    #[test]
    fn empty_estimates_know_nothing() {
        let e = CostEstimates::default();
        assert_eq!(e.draft_step(), None);
        assert_eq!(e.verify(1), None);
        assert_eq!(e.acceptance(1), None);
        assert_eq!(e.expected_emitted(1), Some(1.0));
        assert_eq!(e.expected_emitted(2), None);
        assert_eq!(e.cost_per_token(1), None);
    }

    #[test]
    fn draft_cost_is_per_step_and_averaged() {
        let mut e = CostEstimates::default();
        e.record_draft(4, ms(40), 0.5);
        assert!(close(e.draft_step(), 0.010));
        e.record_draft(2, ms(60), 0.5);
        assert!(close(e.draft_step(), 0.020));
        e.record_draft(0, ms(500), 0.5);
        assert!(
            close(e.draft_step(), 0.020),
            "a call of no steps is ignored"
        );
        assert_eq!(e.draft_samples(), 2);
    }

    #[test]
    fn verify_cost_interpolates_and_extrapolates() {
        let mut e = CostEstimates::default();
        e.record_verify(4, ms(16), 1.0);
        assert!(close(e.verify(1), 0.016), "below the smallest: flat");
        assert!(close(e.verify(9), 0.016), "one point: flat");
        e.record_verify(1, ms(10), 1.0);
        assert!(close(e.verify(2), 0.012));
        assert!(close(e.verify(3), 0.014));
        assert!(close(e.verify(7), 0.022), "slope of the two largest");
        assert!(close(e.verify(1000), e.verify(MAX_TRACKED_BLOCK).unwrap()));
    }

    #[test]
    fn verify_cost_never_drops_below_one_token() {
        let mut e = CostEstimates::default();
        e.record_verify(1, ms(10), 1.0);
        e.record_verify(2, ms(8), 1.0);
        e.record_verify(3, ms(4), 1.0);
        assert!(close(e.verify(2), 0.010));
        assert!(close(e.verify(3), 0.010));
        assert!(
            close(e.verify(6), 0.010),
            "a falling slope is not extrapolated"
        );
    }

    #[test]
    fn garbage_durations_stay_finite() {
        let mut e = CostEstimates::default();
        e.record_verify(1, Duration::ZERO, 0.5);
        e.record_verify(2, Duration::MAX, 0.5);
        e.record_draft(1, Duration::MAX, 0.5);
        e.record_acceptance(1, 1, 0.5);
        assert!(close(e.verify(1), 0.0));
        assert!(close(e.verify(2), 60.0));
        for block in 1..5 {
            assert!(e.cost_per_token(block).is_some_and(f64::is_finite));
        }
    }

    #[test]
    fn acceptance_is_conditional_per_position() {
        let mut e = CostEstimates::default();
        // Accepted 1 of 3: position 1 hit, position 2 missed, position 3 not reached.
        e.record_acceptance(3, 1, 1.0);
        assert!(close(e.acceptance(1), 1.0));
        assert!(close(e.acceptance(2), 0.0));
        assert!(close(e.acceptance(3), 0.0), "unobserved: nearest below");
        e.record_acceptance(3, 3, 0.5);
        assert!(close(e.acceptance(2), 0.5));
        assert!(close(e.acceptance(3), 1.0));
        // E[emitted(4)] = 1 + 1 + 1·0.5 + 1·0.5·1.
        assert!(close(e.expected_emitted(4), 3.0));
    }

    #[test]
    fn cost_per_token_combines_the_parts() {
        let mut e = CostEstimates::default();
        e.record_draft(1, ms(2), 1.0);
        e.record_verify(1, ms(10), 1.0);
        e.record_verify(3, ms(14), 1.0);
        e.record_acceptance(2, 2, 1.0);
        assert!(close(e.cost_per_token(1), 0.010));
        assert!(close(e.cost_per_token(3), (0.004 + 0.014) / 3.0));
    }
}
