//! The one place a round's block size is decided.
//!
//! Four things bound it, and [`BlockPlanner`] merges them in this order:
//! 1. the request's rule ([`super::next_block_size`] over its acceptance history, the
//!    requested and configured sizes, the tokens left);
//! 2. the load cap the caller sets on the request's [`RequestControl`] (for example
//!    [`super::load_block_cap`] from the running requests' count);
//! 3. the process's [`SpeculationGovernor`] cap, for requests that left their block size to
//!    specd;
//! 4. within those, the request's cost-aware policy, which picks the cheapest size per token
//!    it measured and may run rounds plain.
//!
//! The planner also feeds every verified round back to the policy, the history and the
//! governor, so the round loop only drafts, verifies, commits and emits.

use std::sync::Arc;
use std::time::Duration;

use super::controller::{BlockSizeConfig, BlockSizeController};
use super::cost_policy::{DraftMeasurement, RoundMeasurement};
use super::governor::{Drafting, GovernedRound, OpenCost, SpeculationGovernor};
use crate::round_loop::RequestControl;
use crate::verifier::ForwardCost;

/// Decides each round's block size for one request and learns from its rounds.
#[derive(Debug)]
pub struct BlockPlanner {
    controller: BlockSizeController,
    /// The request's control: its load cap may change between rounds.
    control: RequestControl,
    governor: Option<Arc<SpeculationGovernor>>,
    /// The governor judged speculation not worth a drafter session for this request.
    declined: bool,
}

/// One round's block size and what it means for the request's stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedBlock {
    /// Tokens to verify: the bonus token and `block_size - 1` drafts.
    pub block_size: usize,
    /// A round run plain although the request drafts: declined up front, capped to 1 by the
    /// governor, or switched off by the cost-aware policy.
    pub speculation_off: bool,
    /// The cost-aware policy switched speculation on (`Some(true)`) or off (`Some(false)`).
    pub switched: Option<bool>,
}

/// A draft call in progress, as the planner counts it (drafters queue draft calls, so calls
/// running at once make each other slower).
pub struct DraftInProgress {
    _drafting: Option<Drafting>,
    /// Requests drafting when this call started, itself included.
    concurrent: usize,
}

/// What a verified round cost and yielded.
#[derive(Clone, Copy, Debug)]
pub struct RoundOutcome {
    /// The draft call, when the round drafted.
    pub draft: Option<DraftMeasurement>,
    /// [`DraftInProgress`]'s count for that call (1 without a governor).
    pub drafting_alongside: usize,
    /// Drafts verified.
    pub drafted: usize,
    /// Wall time of the verify call.
    pub verify_time: Duration,
    /// The forward the verify ran in, when the verifier reported it.
    pub forward: Option<ForwardCost>,
    /// Drafts accepted.
    pub accepted: usize,
    /// Drafts verified on token-tree branches beside `drafted` (0: a chain).
    pub branches: usize,
    /// The round ran while the request's drafter session was opening: the drafter's prefill
    /// shared the machine with this verify (on one box it takes the verifier's cores, 1.7-2.9x
    /// a plain round's time here), so its time says nothing of what a plain round costs.
    pub beside_open: bool,
}

impl BlockPlanner {
    /// A planner for a request asking for `config`, governed through `control`. A
    /// cost-aware request under a governor starts from what the process learned of requests
    /// alone, not from nothing.
    pub fn new(config: BlockSizeConfig, control: &RequestControl) -> Self {
        let governor = control.governor_handle();
        let learned = governor
            .as_deref()
            .filter(|_| config.cost_aware)
            .and_then(SpeculationGovernor::learned);
        Self {
            controller: BlockSizeController::with_learned(config, learned),
            control: control.clone(),
            governor,
            declined: false,
        }
    }

    /// Whether rounds may still draft.
    pub fn may_draft(&self) -> bool {
        self.controller.is_enabled()
    }

    /// Plain rounds for the rest of the request (no drafter, or it failed).
    pub fn stop_drafting(&mut self) {
        self.controller.disable();
    }

    /// Whether the request should run plain, with no drafter session at all: the process's
    /// estimates say speculation would not save what opening the session costs (a short
    /// request, or plain rows batching better under load). `cached` is how many of the
    /// prompt's tokens the verifier's prefix cache held. Only for requests that left their
    /// block size to specd; a declined request stops drafting.
    pub fn decline_unpaying(
        &mut self,
        prompt_len: usize,
        cached: usize,
        max_new_tokens: usize,
    ) -> bool {
        self.decline_if(|governor| !governor.worth_opening(prompt_len, cached, max_new_tokens))
    }

    /// [`Self::decline_unpaying`] before the prefill, when no open could pay, however much
    /// of the prompt is cached.
    pub fn decline_every_open(&mut self) -> bool {
        self.decline_if(SpeculationGovernor::declines_every_open)
    }

    fn decline_if(&mut self, declines: impl FnOnce(&SpeculationGovernor) -> bool) -> bool {
        let Some(governor) = &self.governor else {
            return false;
        };
        if !self.controller.is_enabled() || !self.controller.is_cost_aware() {
            return false;
        }
        if !declines(governor) {
            return false;
        }
        self.declined = true;
        self.controller.disable();
        true
    }

    /// Records what opening the drafter session cost.
    pub fn record_open(&self, open: &OpenCost) {
        if let Some(governor) = &self.governor {
            governor.record_open(open);
        }
    }

    /// The next round's block size. `remaining` is the tokens the request may still emit
    /// plus one; `opening` says the drafter session is still opening (the round is plain
    /// and the policy does not advance); `drafting` says the request has a usable drafter.
    pub fn plan(&mut self, remaining: usize, opening: bool, drafting: bool) -> PlannedBlock {
        let governed = self
            .controller
            .is_cost_aware()
            .then(|| self.governor.as_deref().and_then(SpeculationGovernor::cap))
            .flatten();
        let cap = match (self.control.block_cap(), governed) {
            (Some(set), Some(governed)) => Some(set.min(governed)),
            (set, governed) => set.or(governed),
        };
        self.controller.set_cap(cap);
        // The governor's cap of 1 and the policy never both run a round plain: the policy
        // plans a cap of 1 as an allowed plain round.
        let held_plain = self.declined || (governed == Some(1) && drafting);
        if opening {
            return PlannedBlock {
                block_size: 1,
                speculation_off: held_plain,
                switched: None,
            };
        }
        let plan = self.controller.plan(remaining);
        PlannedBlock {
            block_size: plan.block_size,
            speculation_off: held_plain || plan.speculation_off,
            switched: plan.switched.then(|| !self.controller.is_speculation_off()),
        }
    }

    /// Marks a draft call as started; keep the result until the call returns.
    pub fn draft_started(&self) -> DraftInProgress {
        let drafting = self.governor.as_ref().map(SpeculationGovernor::drafting);
        DraftInProgress {
            concurrent: drafting.as_ref().map_or(1, |d| d.concurrent),
            _drafting: drafting,
        }
    }

    /// Feeds a verified round to the cost-aware policy, the acceptance history and the
    /// process's governor.
    pub fn observe(&mut self, round: &RoundOutcome) {
        if round.beside_open {
            // Such a plain round is what the cost of every larger block is floored at and
            // compared with: booked, it would make plain decoding look dear for the rest of
            // the request (and, through the governor, for the requests after it), and the
            // largest block look cheapest whatever the acceptance. The policy measures a
            // plain round of its own once the session drafts.
            return;
        }
        // A tree round's draft and verify cost more than its block size's (its branches'
        // rows): the costs per block size learn from chains only, and whether trees pay is
        // measured beside them (see `TreeChoice`).
        if round.branches == 0 {
            self.controller.observe(&RoundMeasurement {
                draft: round.draft,
                verified: round.drafted + 1,
                verify_time: round.verify_time,
                accepted: round.accepted,
            });
        }
        if let Some(governor) = &self.governor {
            governor.record(&GovernedRound {
                // A catch-up call also applied earlier rounds: not a draft step's cost.
                draft: round
                    .draft
                    .filter(|d| !d.catch_up)
                    .map(|d| (d.steps, d.time, round.drafting_alongside)),
                forward: round.forward,
                verify_time: round.verify_time,
                drafted: round.drafted,
                accepted: round.accepted,
            });
        }
        if round.drafted > 0 {
            self.controller.record(round.accepted);
        }
    }
}

impl DraftInProgress {
    /// Requests drafting when this call started, itself included.
    pub fn concurrent(&self) -> usize {
        self.concurrent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(block: usize) -> BlockSizeConfig {
        BlockSizeConfig::fixed(block)
    }

    #[test]
    fn the_load_cap_bounds_the_rule_from_the_next_round_on() {
        let control = RequestControl::new();
        let mut planner = BlockPlanner::new(fixed(6), &control);
        assert_eq!(planner.plan(100, false, true).block_size, 6);
        control.set_block_cap(Some(2));
        assert_eq!(planner.plan(100, false, true).block_size, 2);
        control.set_block_cap(None);
        let plan = planner.plan(3, false, true);
        assert_eq!(plan.block_size, 3, "the tokens left bound it too");
        assert!(!plan.speculation_off);
    }

    #[test]
    fn an_opening_session_gives_plain_rounds_that_are_not_counted_off() {
        let control = RequestControl::new();
        let mut planner = BlockPlanner::new(fixed(4), &control);
        let plan = planner.plan(100, true, true);
        assert_eq!(plan.block_size, 1);
        assert!(!plan.speculation_off);
        assert_eq!(plan.switched, None);
    }

    #[test]
    fn a_request_that_stopped_drafting_plans_plain_rounds() {
        let control = RequestControl::new();
        let mut planner = BlockPlanner::new(BlockSizeConfig::adaptive(5, 4), &control);
        assert!(planner.may_draft());
        planner.stop_drafting();
        assert!(!planner.may_draft());
        assert_eq!(planner.plan(100, false, false).block_size, 1);
    }

    #[test]
    fn a_fixed_block_size_ignores_the_governor() {
        let governor = Arc::new(SpeculationGovernor::new(1, 4));
        let control = RequestControl::governed(governor);
        let mut planner = BlockPlanner::new(fixed(4), &control);
        assert!(
            !planner.decline_unpaying(10, 0, 10),
            "only adaptive requests are declined"
        );
        assert_eq!(planner.plan(100, false, true).block_size, 4);
        let drafting = planner.draft_started();
        assert_eq!(drafting.concurrent(), 1);
        assert_eq!(planner.draft_started().concurrent(), 2);
    }

    /// Prose on one box, about as measured on the real pair: a plain verify 42 ms, each more
    /// row 4.3 ms, a draft step 13 ms, and per ten rounds the first draft accepted in 7, the
    /// second in 4, the third in 3. One draft a round is cheapest per token (34.9 ms against
    /// 36.5 and 39.1 for two and three). The first round runs while the drafter session
    /// opens and its prefill takes the verifier's cores: 100 ms. Priced as a plain round, it
    /// floors every block's verify at 100 ms, and three drafts look cheapest (57.9 ms
    /// against 66.5 for one).
    #[test]
    fn a_plain_round_beside_the_drafters_open_does_not_price_plain_decoding() {
        const PATTERN: [usize; 10] = [3, 1, 3, 0, 1, 0, 1, 3, 0, 2];
        let ms = |v: f64| Duration::from_secs_f64(v / 1e3);
        let governor = Arc::new(SpeculationGovernor::new(1, 4));
        let control = RequestControl::governed(Arc::clone(&governor));
        let mut planner = BlockPlanner::new(BlockSizeConfig::adaptive(4, 4), &control);
        let opening = planner.plan(200, true, true);
        assert_eq!(opening.block_size, 1);
        let beside_open = |verify: Duration| RoundOutcome {
            draft: None,
            drafting_alongside: 1,
            drafted: 0,
            verify_time: verify,
            forward: Some(ForwardCost {
                tokens: 1,
                rows: 1,
                time: verify,
            }),
            accepted: 0,
            branches: 0,
            beside_open: true,
        };
        planner.observe(&beside_open(ms(100.0)));
        let mut sizes = Vec::new();
        for round in 0..80 {
            let block = planner.plan(200, false, true).block_size;
            sizes.push(block);
            let drafted = block - 1;
            let verify = ms(42.0 + 4.3 * drafted as f64);
            planner.observe(&RoundOutcome {
                draft: (drafted > 0).then(|| DraftMeasurement {
                    steps: drafted,
                    time: ms(13.0 * drafted as f64),
                    catch_up: false,
                }),
                drafting_alongside: 1,
                drafted,
                verify_time: verify,
                forward: Some(ForwardCost {
                    tokens: block,
                    rows: 1,
                    time: verify,
                }),
                accepted: drafted.min(PATTERN[round % PATTERN.len()]),
                branches: 0,
                beside_open: false,
            });
        }
        let settled = &sizes[20..];
        let one_draft = settled.iter().filter(|&&b| b == 2).count();
        assert!(
            one_draft * 4 >= settled.len() * 3,
            "one draft a round should win most rounds once measured: {sizes:?}"
        );
        let learned = governor.learned().expect("the request measured enough");
        assert!(
            learned.verify(1).is_some_and(|v| v < 0.05),
            "the process learned the open's round as a plain one: {:?}",
            learned.verify(1)
        );
    }

    /// A governor that measured requests alone: verifies of `b` tokens cost
    /// 50 + 10·(b − 1) ms, draft steps 30 ms, and the first draft is nearly always accepted
    /// while the second never is.
    fn learned_governor() -> Arc<SpeculationGovernor> {
        let governor = Arc::new(SpeculationGovernor::new(1, 5));
        for _ in 0..40 {
            for block in 1..=5usize {
                let drafted = block - 1;
                governor.record(&GovernedRound {
                    draft: (drafted > 0)
                        .then(|| (drafted, Duration::from_millis(30 * drafted as u64), 1)),
                    forward: Some(ForwardCost {
                        tokens: block,
                        rows: 1,
                        time: Duration::from_millis(45 + 10 * drafted as u64),
                    }),
                    verify_time: Duration::from_millis(50 + 10 * drafted as u64),
                    drafted,
                    accepted: drafted.min(1),
                });
            }
        }
        governor
    }

    #[test]
    fn a_new_request_starts_from_what_the_process_learned() {
        // One draft: (30 + 60) ms for ~1.97 tokens beats a plain 50 ms; a second draft
        // costs 40 ms more and is never accepted.
        let governor = learned_governor();
        let learned = governor.learned().expect("enough was measured");
        assert!(learned.acceptance(1).is_some_and(|p| p > 0.9));
        let control = RequestControl::governed(governor);
        let mut planner = BlockPlanner::new(BlockSizeConfig::adaptive(5, 5), &control);
        let first = planner.plan(100, false, true);
        assert_eq!(first.block_size, 2);
        assert!(!first.speculation_off);
        // Without a governor a request knows nothing and starts at its full size.
        let mut cold = BlockPlanner::new(BlockSizeConfig::adaptive(5, 5), &RequestControl::new());
        assert_eq!(cold.plan(100, false, true).block_size, 5);
        // Nothing learned yet: nothing to start from.
        assert!(SpeculationGovernor::new(1, 5).learned().is_none());
    }

    #[test]
    fn observed_drafting_rounds_feed_the_rule() {
        let control = RequestControl::new();
        let mut planner = BlockPlanner::new(
            BlockSizeConfig::adaptive(8, 4).with_cost_aware(false),
            &control,
        );
        for _ in 0..8 {
            assert_eq!(planner.plan(100, false, true).block_size, 4);
            planner.observe(&RoundOutcome {
                draft: None,
                drafting_alongside: 1,
                drafted: 3,
                verify_time: Duration::ZERO,
                forward: None,
                accepted: 3,
                branches: 0,
                beside_open: false,
            });
        }
        assert_eq!(
            planner.plan(100, false, true).block_size,
            8,
            "full-depth hits after warm-up grow the block"
        );
    }
}
