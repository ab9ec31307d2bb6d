//! Cost-aware block size: speculate only as far as it pays, never slower than plain decoding.
//!
//! Each round takes the block size `bs` in `1..=upper` with the lowest expected cost per
//! emitted token, `(draft_step × (bs − 1) + verify(bs)) / E[emitted(bs)]`, from running
//! estimates ([`CostEstimates`]) fed with measured durations; `upper` is what the §4.1 rule
//! and the external cap allow. `bs = 1` is a plain decoding step through the verifier:
//! speculation is then off, the drafter session stays open and receives the carries later.
//! While off, a speculative probe runs after 8 plain rounds, then 16, 32, … up to
//! [`MAX_BACKOFF`]; it re-measures draft cost and acceptance, and speculation comes back as
//! soon as it is cheaper again. While on below `upper`, one round in
//! [`INITIAL_EXPLORE_EVERY`] (doubling up to [`MAX_EXPLORE_EVERY`] while it changes nothing)
//! drafts one more than the cheapest size, so that the acceptance past the chosen block is
//! measured by this request and not only taken from earlier ones. The policy holds no
//! clock: the round loop measures.

use std::time::Duration;

use super::cost_estimates::{CostEstimates, MAX_SAMPLE};

/// Weight of an ordinary round's sample in the estimates.
pub const ROUND_WEIGHT: f64 = 0.15;
/// Weight of a probe round's sample: probes are rare, so each one counts for more.
pub const PROBE_WEIGHT: f64 = 0.5;
/// Plain rounds before the first probe after speculation switched off.
pub const INITIAL_BACKOFF: u32 = 8;
/// Most plain rounds between two probes.
pub const MAX_BACKOFF: u32 = 128;
/// Speculative rounds of a probe at most; a probe ends early once it measured a draft call
/// that did not have to catch up on plain rounds.
pub const PROBE_ROUNDS: u32 = 2;
/// Draft calls measured before speculation may switch off (the first calls of a session
/// often pay one-off setup).
pub const MIN_DRAFT_SAMPLES: u64 = 3;
/// Rounds at a size below the allowed one before a round drafts one more, so that the
/// acceptance of the position after the chosen block is measured again: a request that
/// started from what other requests showed (prose, say) would otherwise never learn that
/// its own deeper drafts are accepted (an edit that copies its prompt).
pub const INITIAL_EXPLORE_EVERY: u32 = 4;
/// Most rounds between two such explorations: each one that does not make a larger block
/// pay doubles the wait.
pub const MAX_EXPLORE_EVERY: u32 = 64;

/// What one round cost and yielded, as measured by the round loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundMeasurement {
    /// The draft call, `None` in a plain round.
    pub draft: Option<DraftMeasurement>,
    /// Tokens verified: the bonus plus the drafts.
    pub verified: usize,
    /// Wall time of the verify call.
    pub verify_time: Duration,
    /// Drafts accepted.
    pub accepted: usize,
}

/// One draft call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftMeasurement {
    /// Drafts asked for.
    pub steps: usize,
    /// Wall time of the call.
    pub time: Duration,
    /// Whether the call also applied the carries of plain rounds (more than one round's),
    /// which a drafter may pay for: such a time is at most an upper bound of a draft step.
    pub catch_up: bool,
}

/// The block size for one round and how the policy got there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundPlan {
    /// Verify width: 1 is a plain round.
    pub block_size: usize,
    /// The policy chose a plain round although the rule and cap allowed drafts.
    pub speculation_off: bool,
    /// Speculation switched off or back on with this round.
    pub switched: bool,
}

impl RoundPlan {
    fn allowed(block_size: usize) -> Self {
        Self {
            block_size,
            speculation_off: false,
            switched: false,
        }
    }

    fn plain(switched: bool) -> Self {
        Self {
            block_size: 1,
            speculation_off: true,
            switched,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Speculating at the cheapest size.
    On,
    /// Plain rounds; `wait` more before the next probe.
    Off { wait: u32 },
    /// Speculative rounds re-measuring while off; `left` more at most.
    Probing { left: u32 },
}

/// The per-request cost-aware policy: deterministic, fed by [`Self::record`].
#[derive(Clone, Debug, PartialEq)]
pub struct CostAwarePolicy {
    estimates: CostEstimates,
    state: State,
    /// Plain rounds before the next probe once a probe fails.
    backoff: u32,
    /// Rounds between two explorations of the position after the chosen block.
    explore_every: u32,
    /// Rounds since the last exploration.
    since_explore: u32,
    /// The block size the last round explored beyond, until the next plan judges it.
    explored_from: Option<usize>,
}

impl Default for CostAwarePolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl CostAwarePolicy {
    /// A policy that starts speculating.
    pub fn new() -> Self {
        Self {
            estimates: CostEstimates::default(),
            state: State::On,
            backoff: INITIAL_BACKOFF,
            explore_every: INITIAL_EXPLORE_EVERY,
            since_explore: 0,
            explored_from: None,
        }
    }

    /// A policy that starts speculating from `learned` estimates (what earlier requests
    /// measured) instead of none: its first rounds already run the cheapest size.
    pub fn with_estimates(learned: CostEstimates) -> Self {
        Self {
            estimates: learned,
            ..Self::new()
        }
    }

    /// The running estimates.
    pub fn estimates(&self) -> &CostEstimates {
        &self.estimates
    }

    /// Whether speculation is currently off (probes included).
    pub fn is_off(&self) -> bool {
        self.state != State::On
    }

    /// Plans the next round given the largest size the rule and cap allow.
    pub fn plan(&mut self, upper: usize) -> RoundPlan {
        if upper <= 1 {
            return RoundPlan::allowed(1);
        }
        match self.state {
            State::Off { wait } if wait > 0 => {
                self.state = State::Off { wait: wait - 1 };
                RoundPlan::plain(false)
            }
            State::Off { .. } => {
                self.state = State::Probing { left: PROBE_ROUNDS };
                RoundPlan::allowed(self.cheapest(2, upper).unwrap_or(upper))
            }
            State::Probing { left } if left > 0 => {
                RoundPlan::allowed(self.cheapest(2, upper).unwrap_or(upper))
            }
            State::Probing { .. } => match self.cheapest(1, upper) {
                Some(block) if block > 1 => {
                    self.state = State::On;
                    self.backoff = INITIAL_BACKOFF;
                    RoundPlan {
                        switched: true,
                        ..RoundPlan::allowed(block)
                    }
                }
                _ => {
                    self.backoff = self.backoff.saturating_mul(2).min(MAX_BACKOFF);
                    self.switch_off();
                    RoundPlan::plain(false)
                }
            },
            State::On => self.plan_on(upper),
        }
    }

    fn plan_on(&mut self, upper: usize) -> RoundPlan {
        let e = &self.estimates;
        if e.draft_samples() > 0 && !e.has_verify(1) {
            // One plain round measures the cost speculation is compared with.
            return RoundPlan {
                speculation_off: true,
                ..RoundPlan::allowed(1)
            };
        }
        match self.cheapest(1, upper) {
            None => RoundPlan::allowed(upper),
            Some(1) if self.estimates.draft_samples() < MIN_DRAFT_SAMPLES => {
                RoundPlan::allowed(upper)
            }
            Some(1) => {
                self.switch_off();
                RoundPlan::plain(true)
            }
            Some(block) => RoundPlan::allowed(self.explore_beyond(block, upper)),
        }
    }

    /// `block`, or one more when it is time to measure the position after it again.
    fn explore_beyond(&mut self, block: usize, upper: usize) -> usize {
        if let Some(from) = self.explored_from.take() {
            self.explore_every = if block > from {
                INITIAL_EXPLORE_EVERY
            } else {
                self.explore_every.saturating_mul(2).min(MAX_EXPLORE_EVERY)
            };
        }
        if block >= upper {
            self.since_explore = 0;
            return block;
        }
        self.since_explore += 1;
        if self.since_explore < self.explore_every {
            return block;
        }
        self.since_explore = 0;
        self.explored_from = Some(block);
        block + 1
    }

    /// Off, counting this round as the first of `backoff` plain rounds.
    fn switch_off(&mut self) {
        self.state = State::Off {
            wait: self.backoff.saturating_sub(1),
        };
    }

    /// The size in `from..=upper` with the lowest expected cost per token (the larger on a
    /// tie, since fewer rounds also save what is not measured); `None` while a cost in the
    /// range is unknown.
    fn cheapest(&self, from: usize, upper: usize) -> Option<usize> {
        let mut best: Option<(usize, f64)> = None;
        for block in from..=upper {
            let cost = self.estimates.cost_per_token(block)?;
            if best.is_none_or(|(_, best_cost)| cost <= best_cost) {
                best = Some((block, cost));
            }
        }
        best.map(|(block, _)| block)
    }

    /// Feeds one round's measurements to the estimates.
    pub fn record(&mut self, round: &RoundMeasurement) {
        let probing = matches!(self.state, State::Probing { .. });
        let weight = if probing { PROBE_WEIGHT } else { ROUND_WEIGHT };
        let e = &mut self.estimates;
        e.record_verify(round.verified, round.verify_time, weight);
        let drafted = round.verified.saturating_sub(1);
        let accepted = round.accepted.min(drafted);
        match self.explored_from {
            Some(from) if drafted >= from => {
                // The chosen block's positions count as in any round; the explored one is
                // rarely measured, so its sample counts as a probe's.
                e.record_acceptance(from - 1, accepted.min(from - 1), weight);
                if accepted + 1 >= from {
                    e.record_position(from, accepted >= from, PROBE_WEIGHT);
                }
            }
            _ => e.record_acceptance(drafted, accepted, weight),
        }
        let mut clean_draft = false;
        if let Some(draft) = round.draft.filter(|d| d.steps > 0) {
            // A catch-up call bounds the step cost from above: only a cheaper one tells
            // something, and a dearer one leaves the probe going.
            let per_step = draft.time.min(MAX_SAMPLE).as_secs_f64() / draft.steps as f64;
            let informative = !draft.catch_up || e.draft_step().is_none_or(|d| per_step <= d);
            if informative {
                e.record_draft(draft.steps, draft.time, weight);
                clean_draft = true;
            }
        }
        // Only rounds that drafted count as probes (a load cap may force plain ones).
        if let (State::Probing { left }, Some(_)) = (self.state, round.draft) {
            let left = if clean_draft {
                0
            } else {
                left.saturating_sub(1)
            };
            self.state = State::Probing { left };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Synthetic round costs: verify `base + per_token × bs`, draft `draft_step` per draft.
    #[derive(Clone, Copy)]
    struct Costs {
        base_ms: u64,
        per_token_ms: u64,
        draft_step_ms: u64,
    }

    /// Runs one planned round with drafts accepted by `accept(drafted)`; returns the plan.
    fn round(
        policy: &mut CostAwarePolicy,
        upper: usize,
        costs: Costs,
        catch_up: bool,
        accept: impl Fn(usize) -> usize,
    ) -> RoundPlan {
        let plan = policy.plan(upper);
        assert!((1..=upper.max(1)).contains(&plan.block_size), "{plan:?}");
        let drafted = plan.block_size - 1;
        let ms = Duration::from_millis;
        let draft = (drafted > 0).then(|| DraftMeasurement {
            steps: drafted,
            time: ms(costs.draft_step_ms * drafted as u64),
            catch_up,
        });
        policy.record(&RoundMeasurement {
            draft,
            verified: plan.block_size,
            verify_time: ms(costs.base_ms + costs.per_token_ms * plan.block_size as u64),
            accepted: accept(drafted),
        });
        plan
    }

    fn all(drafted: usize) -> usize {
        drafted
    }

    fn none(_: usize) -> usize {
        0
    }

    const CHEAP: Costs = Costs {
        base_ms: 20,
        per_token_ms: 1,
        draft_step_ms: 2,
    };

    fn plans(
        policy: &mut CostAwarePolicy,
        rounds: usize,
        upper: usize,
        costs: Costs,
        accept: impl Fn(usize) -> usize + Copy,
    ) -> Vec<RoundPlan> {
        (0..rounds)
            .map(|_| round(policy, upper, costs, false, accept))
            .collect()
    }

    #[test]
    fn speculates_fully_when_it_pays() {
        let mut p = CostAwarePolicy::new();
        let sizes: Vec<usize> = plans(&mut p, 12, 4, CHEAP, all)
            .iter()
            .map(|plan| plan.block_size)
            .collect();
        // One calibration round measures plain decoding, then the full block pays.
        assert_eq!(sizes, [4, 1, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]);
        assert!(!p.is_off());
    }

    #[test]
    fn switches_off_when_drafting_is_slow() {
        let mut p = CostAwarePolicy::new();
        let slow = Costs {
            draft_step_ms: 40,
            ..CHEAP
        };
        let out = plans(&mut p, 40, 4, slow, all);
        let switched_at = out.iter().position(|plan| plan.switched).unwrap();
        assert!(switched_at <= 1 + MIN_DRAFT_SAMPLES as usize + 1, "{out:?}");
        assert!(p.is_off());
        // After switching off only probes draft, with a growing gap.
        let probes: Vec<usize> = out
            .iter()
            .enumerate()
            .skip(switched_at)
            .filter(|(_, plan)| plan.block_size > 1)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(probes.len(), 2, "{out:?}");
        assert_eq!(probes[0], switched_at + INITIAL_BACKOFF as usize);
        assert!(out.iter().skip(switched_at + 1).all(|plan| !plan.switched));
    }

    #[test]
    fn switches_off_when_acceptance_is_low() {
        let mut p = CostAwarePolicy::new();
        let out = plans(&mut p, 20, 4, CHEAP, none);
        assert!(out.iter().any(|plan| plan.switched));
        assert!(p.is_off());
        assert!(out.last().unwrap().speculation_off);
    }

    #[test]
    fn zero_cost_drafts_never_switch_off() {
        let mut p = CostAwarePolicy::new();
        let free = Costs {
            draft_step_ms: 0,
            per_token_ms: 0,
            ..CHEAP
        };
        let out = plans(&mut p, 30, 4, free, none);
        assert!(out.iter().all(|plan| !plan.switched), "{out:?}");
        let zero = Costs { base_ms: 0, ..free };
        let mut p = CostAwarePolicy::new();
        let out = plans(&mut p, 30, 4, zero, |d| d / 2);
        assert!(
            out.iter().skip(2).all(|plan| plan.block_size == 4),
            "{out:?}"
        );
    }

    #[test]
    fn comes_back_on_after_a_probe_when_acceptance_recovers() {
        let mut p = CostAwarePolicy::new();
        plans(&mut p, 30, 4, CHEAP, none);
        assert!(p.is_off());
        let out = plans(&mut p, 2 * MAX_BACKOFF as usize, 4, CHEAP, all);
        let back_on = out.iter().position(|plan| plan.switched).unwrap();
        assert!(!p.is_off());
        assert!(out[back_on].block_size > 1);
        assert!(
            out[back_on..].iter().all(|plan| plan.block_size > 1),
            "{out:?}"
        );
        assert_eq!(out.last().unwrap().block_size, 4, "{out:?}");
    }

    #[test]
    fn comes_back_on_when_drafting_gets_cheap() {
        let mut p = CostAwarePolicy::new();
        let slow = Costs {
            draft_step_ms: 40,
            ..CHEAP
        };
        plans(&mut p, 30, 4, slow, all);
        assert!(p.is_off());
        let out = plans(&mut p, 2 * MAX_BACKOFF as usize, 4, CHEAP, all);
        assert!(out.iter().any(|plan| plan.switched));
        assert!(!p.is_off());
    }

    #[test]
    fn probes_back_off_up_to_the_cap() {
        let mut p = CostAwarePolicy::new();
        let out = plans(&mut p, 1200, 4, CHEAP, none);
        let probes: Vec<usize> = out
            .iter()
            .enumerate()
            .skip(10)
            .filter(|(_, plan)| plan.block_size > 1)
            .map(|(i, _)| i)
            .collect();
        let gaps: Vec<usize> = probes.windows(2).map(|w| w[1] - w[0]).collect();
        // A probe after a clean draft call is one round; each gap is that round plus the
        // plain rounds of the doubled backoff.
        assert_eq!(&gaps[..4], [17, 33, 65, 129], "{probes:?}");
        assert!(gaps[4..].iter().all(|&g| g == MAX_BACKOFF as usize + 1));
    }

    #[test]
    fn a_catch_up_probe_is_followed_by_a_measured_one() {
        let mut p = CostAwarePolicy::new();
        plans(&mut p, 30, 4, CHEAP, none);
        assert!(p.is_off());
        while p.plan(4).block_size == 1 {}
        // The probe's draft applied plain rounds' carries: its time is not a draft step.
        p.record(&RoundMeasurement {
            draft: Some(DraftMeasurement {
                steps: 3,
                time: Duration::from_secs(5),
                catch_up: true,
            }),
            verified: 4,
            verify_time: Duration::from_millis(24),
            accepted: 3,
        });
        assert!(p.estimates().draft_step().unwrap() < 0.01);
        assert!(p.plan(4).block_size > 1, "the probe goes on");
    }

    #[test]
    fn capped_plain_rounds_do_not_end_a_probe() {
        let mut p = CostAwarePolicy::new();
        plans(&mut p, 30, 4, CHEAP, none);
        while p.plan(4).block_size == 1 {}
        for _ in 0..PROBE_ROUNDS {
            assert_eq!(p.plan(1), RoundPlan::allowed(1));
            p.record(&RoundMeasurement {
                draft: None,
                verified: 1,
                verify_time: Duration::from_millis(21),
                accepted: 0,
            });
        }
        assert!(p.plan(4).block_size > 1, "still probing");
    }

    #[test]
    fn a_cheap_catch_up_probe_counts() {
        let mut p = CostAwarePolicy::new();
        let slow = Costs {
            draft_step_ms: 30,
            ..CHEAP
        };
        plans(&mut p, 30, 4, slow, all);
        assert!(p.is_off());
        while p.plan(4).block_size == 1 {}
        p.record(&RoundMeasurement {
            draft: Some(DraftMeasurement {
                steps: 3,
                time: Duration::from_millis(3),
                catch_up: true,
            }),
            verified: 4,
            verify_time: Duration::from_millis(24),
            accepted: 3,
        });
        assert!(p.estimates().draft_step().unwrap() < 0.02);
        let plan = p.plan(4);
        assert!(plan.switched && plan.block_size > 1, "{plan:?}");
    }

    #[test]
    fn shrinks_the_block_when_verify_cost_is_steep() {
        let mut p = CostAwarePolicy::new();
        let steep = Costs {
            base_ms: 10,
            per_token_ms: 10,
            draft_step_ms: 1,
        };
        // Position 1 always accepted, later ones never: only the first draft pays.
        let out = plans(&mut p, 40, 6, steep, |d| d.min(1));
        assert_eq!(out.last().unwrap().block_size, 2, "{out:?}");
    }

    /// Estimates learned from prose (the first draft accepted in 7 rounds of 10, the second
    /// in 1.5 given the first, the third in 1) for a request that copies its prompt and
    /// accepts every draft: one draft a round looks cheapest at first (34.7 ms a token
    /// against 42 for two), and only measuring the second position again shows that the
    /// full block pays.
    #[test]
    fn a_request_easier_than_the_learned_ones_grows_its_block() {
        let costs = Costs {
            base_ms: 38,
            per_token_ms: 4,
            draft_step_ms: 13,
        };
        let ms = Duration::from_millis;
        let mut learned = CostEstimates::default();
        learned.seed_acceptance(&[0.7, 0.15, 0.1]);
        learned.record_draft(1, ms(costs.draft_step_ms), 1.0);
        for block in 1..=4u64 {
            let verify = costs.base_ms + costs.per_token_ms * block;
            learned.record_verify(block as usize, ms(verify), 1.0);
        }
        let mut p = CostAwarePolicy::with_estimates(learned);
        let sizes: Vec<usize> = plans(&mut p, 40, 4, costs, all)
            .iter()
            .map(|plan| plan.block_size)
            .collect();
        assert_eq!(sizes[0], 2, "{sizes:?}");
        assert!(sizes[24..].iter().all(|&b| b == 4), "{sizes:?}");
    }

    /// The same estimates for a request that accepts no draft past the first: each
    /// measurement of the second position confirms one draft, and they grow rarer.
    #[test]
    fn explorations_that_do_not_pay_grow_rare() {
        let costs = Costs {
            base_ms: 38,
            per_token_ms: 4,
            draft_step_ms: 13,
        };
        let ms = Duration::from_millis;
        let mut learned = CostEstimates::default();
        learned.seed_acceptance(&[0.7, 0.15, 0.1]);
        learned.record_draft(1, ms(costs.draft_step_ms), 1.0);
        for block in 1..=4u64 {
            let verify = costs.base_ms + costs.per_token_ms * block;
            learned.record_verify(block as usize, ms(verify), 1.0);
        }
        let mut p = CostAwarePolicy::with_estimates(learned);
        let sizes: Vec<usize> = plans(&mut p, 200, 4, costs, |drafted| drafted.min(1))
            .iter()
            .map(|plan| plan.block_size)
            .collect();
        let explored = sizes.iter().filter(|&&b| b > 2).count();
        assert!(sizes.iter().all(|&b| b == 2 || b == 3), "{sizes:?}");
        assert!(
            (3..=8).contains(&explored),
            "{explored} explorations: {sizes:?}"
        );
    }

    #[test]
    fn never_exceeds_the_allowed_size() {
        let mut p = CostAwarePolicy::new();
        for upper in [6, 3, 1, 0, 2, 5] {
            for _ in 0..10 {
                let plan = round(&mut p, upper, CHEAP, false, all);
                assert!(plan.block_size <= upper.max(1));
                if upper <= 1 {
                    assert!(!plan.speculation_off && !plan.switched);
                }
            }
        }
    }

    #[test]
    fn same_inputs_same_plans() {
        let run = || {
            let mut p = CostAwarePolicy::new();
            plans(&mut p, 300, 5, CHEAP, |d| d / 3)
        };
        assert_eq!(run(), run());
    }
}
