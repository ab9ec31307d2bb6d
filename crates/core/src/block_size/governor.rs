//! Speculation under load, decided for every request of a process at once.
//!
//! A request's own cost-aware policy compares the rounds it measures, but under load those
//! depend on what the other requests do: every request's rows share one batched forward,
//! and draft calls queue on the drafters. A request alone would see a speculative round
//! cost little more than a plain one, while every request speculating makes the shared
//! forward and the drafter queue grow for all. So the governor compares whole-process
//! throughput: with `n` active requests all at block size `bs`,
//!
//! `seconds per token(bs) = (F(n·bs) + (bs − 1)·d·⌈n / P⌉) / (n · E[emitted(bs)])`,
//!
//! where `F(t)` is the measured cost of a forward of `t` tokens ([`ForwardCurve`]), `d` one
//! draft step, `P` how many drafters run in parallel and `E[emitted]` follows the acceptance
//! of every request's rounds. `bs = 1` is plain decoding. The cheapest size caps every
//! request's block size; a cap of 1 switches speculation off for all, with their drafter
//! sessions kept open, and it comes back on when the load falls or the costs change.

use crate::sync::lock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::cost_estimates::{seconds, CostEstimates, Ewma, MAX_TRACKED_BLOCK};
use super::forward_curve::ForwardCurve;
use crate::metric_names::SPECULATION_CAP;
use crate::verifier::ForwardCost;

/// Weight of one sample in the shared estimates: many requests feed them.
pub const GOVERNOR_WEIGHT: f64 = 0.1;

/// One request in this many that the estimates say not to speculate speculates anyway, so
/// that the estimates follow a drafter, or prompts, that got better.
pub const RELEARN_EVERY: u64 = 8;
/// Speculation must be this much cheaper per token than plain decoding to stay on under
/// load: close calls go to plain decoding, which cannot lose.
pub const SPECULATION_MARGIN: f64 = 0.95;

/// What one round of one request cost and yielded, for the shared estimates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GovernedRound {
    /// The draft call: drafts asked for, wall time, and how many requests were drafting when
    /// it started (itself included). `None` in a plain round.
    pub draft: Option<(usize, Duration, usize)>,
    /// The forward the round's verify ran in, when the verifier reported it.
    pub forward: Option<ForwardCost>,
    /// Wall time of the verify call, as the request saw it.
    pub verify_time: Duration,
    /// Drafts verified.
    pub drafted: usize,
    /// Drafts accepted.
    pub accepted: usize,
}

/// What opening one drafter session cost, for pricing later opens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenCost {
    /// Prompt tokens of the request.
    pub prompt: usize,
    /// Of those, the ones the verifier's prefix cache held.
    pub verifier_cached: usize,
    /// Context positions the drafter computed or received to open (the whole prompt where
    /// it did not say).
    pub computed: usize,
    /// Wall time of the open.
    pub time: Duration,
}

impl OpenCost {
    /// An open of `prompt` tokens that no cache held.
    pub fn cold(prompt: usize, time: Duration) -> Self {
        Self {
            prompt,
            verifier_cached: 0,
            computed: prompt,
            time,
        }
    }
}

/// Opens of fewer positions than this teach no cost per position.
pub const MIN_PRICED_OPEN: usize = 8;

/// What a drafter session would save and cost, as the estimates say now.
struct OpenJudgement {
    active: usize,
    /// Seconds speculation saves per token.
    saving: Option<f64>,
    /// Seconds the open would take.
    cost: Option<f64>,
    /// Positions the drafter is expected to compute.
    positions: f64,
}

/// Shared cost estimates and the block-size cap they give under the current load.
#[derive(Debug)]
pub struct SpeculationGovernor {
    /// Drafters that run draft steps in parallel; 0 when drafting takes no shared resource.
    drafter_parallelism: AtomicUsize,
    max_block_size: usize,
    estimates: Mutex<Estimates>,
    active: AtomicUsize,
    drafting: AtomicUsize,
    /// The cap plus one; 0 means no cap.
    cap: AtomicUsize,
    /// Requests the estimates said not to speculate.
    declined: AtomicU64,
    /// Requests under load judged while a cost was unknown.
    unknown: AtomicU64,
}

#[derive(Debug, Default)]
struct Estimates {
    forward: ForwardCurve,
    /// Draft step, and whole verify calls of requests alone in their forward, pooled over
    /// requests.
    rounds: CostEstimates,
    /// Seconds per context position a drafter computes (or receives) to open a session.
    open_per_token: Ewma,
    /// Of the prompt tokens the verifier's prefix cache held, the share the drafter held too
    /// when it opened (a draft model's own prefix cache; none for a snapshot).
    open_reuse: Ewma,
    acceptance: PooledAcceptance,
}

/// Acceptance by draft position over recent rounds of every request, as decayed counts.
/// Read with one accepted and one rejected draft added (Laplace's rule), so that a few
/// lucky rounds at startup do not promise what a drafter rarely delivers.
#[derive(Debug, Default)]
struct PooledAcceptance {
    /// `(accepted, observed)` of position `i + 1`.
    counts: Vec<(f64, f64)>,
}

/// How much older rounds still count at each new one (about the last 100 rounds matter).
const ACCEPTANCE_DECAY: f64 = 0.99;
/// Speculative rounds (decayed) the pooled acceptance needs before it is used: with fewer,
/// the Laplace-smoothed rates are mostly the prior, and a session opened beside plain rounds
/// may run only one or two speculative rounds in a short request.
const MIN_ACCEPTANCE_ROUNDS: f64 = 16.0;

impl PooledAcceptance {
    fn record(&mut self, drafted: usize, accepted: usize) {
        let observed = drafted.min(accepted + 1).min(MAX_TRACKED_BLOCK);
        if self.counts.len() < observed {
            self.counts.resize(observed, (0.0, 0.0));
        }
        for (index, (hits, trials)) in self.counts.iter_mut().enumerate() {
            *hits *= ACCEPTANCE_DECAY;
            *trials *= ACCEPTANCE_DECAY;
            if index < observed {
                *trials += 1.0;
                if index < accepted {
                    *hits += 1.0;
                }
            }
        }
    }

    /// Acceptance of each draft position observed, Laplace-smoothed as
    /// [`Self::expected_emitted`] reads it; `None` until [`MIN_ACCEPTANCE_ROUNDS`].
    fn rates(&self) -> Option<Vec<f64>> {
        match self.counts.first() {
            Some(&(_, trials)) if trials >= MIN_ACCEPTANCE_ROUNDS => {}
            _ => return None,
        }
        Some(
            self.counts
                .iter()
                .map(|&(hits, trials)| (hits + 1.0) / (trials + 2.0))
                .collect(),
        )
    }

    /// Expected tokens a round of `block` emits; `None` until [`MIN_ACCEPTANCE_ROUNDS`]
    /// speculative rounds were seen (decayed), so that no decision rests on the few rounds
    /// of a first short request.
    fn expected_emitted(&self, block: usize) -> Option<f64> {
        match self.counts.first() {
            Some(&(_, trials)) if trials >= MIN_ACCEPTANCE_ROUNDS => {}
            _ => return None,
        }
        let (mut expected, mut reach) = (1.0, 1.0);
        for position in 1..block.min(MAX_TRACKED_BLOCK + 1) {
            let (hits, trials) = self.counts.get(position - 1).copied().unwrap_or_default();
            reach *= (hits + 1.0) / (trials + 2.0);
            expected += reach;
        }
        Some(expected)
    }
}

/// A draft call in progress; counts as drafting until dropped. It holds the governor, so a
/// request can keep it across its own draft call.
pub struct Drafting {
    governor: Arc<SpeculationGovernor>,
    /// Requests drafting when this call started, itself included.
    pub concurrent: usize,
}

impl Drop for Drafting {
    fn drop(&mut self) {
        self.governor.drafting.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SpeculationGovernor {
    /// A governor for requests whose drafts come from `drafter_parallelism` drafters running
    /// in parallel (0: drafting shares nothing, as prompt lookup) and verify at most
    /// `max_block_size` tokens per round.
    pub fn new(drafter_parallelism: usize, max_block_size: usize) -> Self {
        metrics::gauge!(SPECULATION_CAP).set(0.0);
        Self {
            drafter_parallelism: AtomicUsize::new(drafter_parallelism),
            max_block_size: max_block_size.max(1),
            estimates: Mutex::new(Estimates::default()),
            active: AtomicUsize::new(0),
            drafting: AtomicUsize::new(0),
            cap: AtomicUsize::new(0),
            declined: AtomicU64::new(0),
            unknown: AtomicU64::new(0),
        }
    }

    /// The block-size cap every request should follow now; `None` when speculation is left
    /// to each request (one request alone, or costs not known yet).
    pub fn cap(&self) -> Option<usize> {
        match self.cap.load(Ordering::Relaxed) {
            0 => None,
            encoded => Some(encoded - 1),
        }
    }

    /// Sets how many requests are running.
    pub fn set_active(&self, active: usize) {
        self.active.store(active, Ordering::Relaxed);
        self.decide(&self.lock());
    }

    /// Sets how many drafters run draft steps in parallel (a pool that grew or shrank).
    pub fn set_drafter_parallelism(&self, drafters: usize) {
        self.drafter_parallelism.store(drafters, Ordering::Relaxed);
    }

    /// Marks a draft call as started.
    pub fn drafting(self: &Arc<Self>) -> Drafting {
        let concurrent = self.drafting.fetch_add(1, Ordering::Relaxed) + 1;
        Drafting {
            governor: Arc::clone(self),
            concurrent,
        }
    }

    /// Feeds one request's round to the shared estimates and decides again.
    pub fn record(&self, round: &GovernedRound) {
        let mut estimates = self.lock();
        if let Some(forward) = round.forward {
            estimates
                .forward
                .record(forward.tokens, forward.time, GOVERNOR_WEIGHT);
            if forward.rows == 1 {
                // A request alone in its forward: what a round costs one request end to
                // end, which the forward alone does not tell.
                estimates.rounds.record_verify(
                    round.drafted + 1,
                    round.verify_time,
                    GOVERNOR_WEIGHT,
                );
            }
        }
        if let Some((steps, time, concurrent)) = round.draft.filter(|d| d.0 > 0) {
            // A call that queued behind others' drafts measured their steps too.
            let queued = self.queue_length(concurrent) as u32;
            estimates
                .rounds
                .record_draft(steps, time / queued.max(1), GOVERNOR_WEIGHT);
        }
        if round.drafted > 0 {
            estimates
                .acceptance
                .record(round.drafted, round.accepted.min(round.drafted));
        }
        self.decide(&estimates);
    }

    /// What the process learned of rounds of requests alone in their forward, for a new
    /// request's cost-aware policy to start from: verify costs, the draft step and
    /// acceptance by position. `None` until a plain and a speculative verify, a draft step
    /// and [`MIN_ACCEPTANCE_ROUNDS`] rounds were measured.
    pub fn learned(&self) -> Option<CostEstimates> {
        let estimates = self.lock();
        let rounds = &estimates.rounds;
        let speculative = (2..=MAX_TRACKED_BLOCK).any(|block| rounds.has_verify(block));
        if rounds.draft_step().is_none() || !rounds.has_verify(1) || !speculative {
            return None;
        }
        let mut learned = rounds.clone();
        learned.seed_acceptance(&estimates.acceptance.rates()?);
        Some(learned)
    }

    /// Records what opening a drafter session cost. The time prices the positions the
    /// drafter computed; where the verifier's prefix cache held part of the prompt, how much
    /// of that part the drafter held too is learned beside it.
    pub fn record_open(&self, open: &OpenCost) {
        let mut estimates = self.lock();
        if open.verifier_cached > 0 {
            let held = open.prompt.saturating_sub(open.computed) as f64;
            let share = (held / open.verifier_cached as f64).clamp(0.0, 1.0);
            estimates.open_reuse.update(share, GOVERNOR_WEIGHT);
        }
        // A shorter open's time is mostly its fixed cost (a call, a session), which per
        // position would price a long prompt many times too dear.
        if open.computed >= MIN_PRICED_OPEN {
            let sample = seconds(open.time) / open.computed as f64;
            estimates.open_per_token.update(sample, GOVERNOR_WEIGHT);
        }
    }

    /// Whether a new request of `prompt_len` prompt tokens, `cached` of them held by the
    /// verifier's prefix cache, and up to `max_new_tokens` new ones should open a drafter
    /// session: what speculation would save over its tokens at the current load against
    /// what opening costs, and, for a request running alone, for one in [`RELEARN_EVERY`]
    /// of those declined. The open is priced on the positions the drafter is expected to
    /// compute: the prompt less the share of the cached tokens drafters were seen to hold
    /// (all of them until an open after a prefix-cache hit was seen). While a cost is
    /// unknown: yes for a request running alone, and under load for one request in
    /// [`RELEARN_EVERY`].
    pub fn worth_opening(&self, prompt_len: usize, cached: usize, max_new_tokens: usize) -> bool {
        let judged = self.judge_open(prompt_len, cached);
        let (Some(saving), Some(cost)) = (judged.saving, judged.cost) else {
            // Only a session teaches what drafting costs. Under load one in RELEARN_EVERY
            // requests opens one: where rounds stay plain, a session per request prefilled
            // every prompt on the drafter beside the verifier and never drafted.
            let probe = judged.active == 1
                || self
                    .unknown
                    .fetch_add(1, Ordering::Relaxed)
                    .is_multiple_of(RELEARN_EVERY);
            tracing::debug!(
                active = judged.active,
                saving = ?judged.saving,
                cost = ?judged.cost,
                probe,
                "a drafter cost is unknown"
            );
            return probe;
        };
        let saved = max_new_tokens as f64 * saving;
        tracing::debug!(
            active = judged.active,
            saved,
            cost,
            positions = judged.positions,
            "judging a drafter session"
        );
        if saved > cost {
            return true;
        }
        if judged.active > 1 {
            // Under load a relearning session costs every request sharing the forward.
            return false;
        }
        self.declined.fetch_add(1, Ordering::Relaxed) % RELEARN_EVERY == RELEARN_EVERY - 1
    }

    /// Whether [`Self::worth_opening`] would say no to every request now, however short its
    /// uncached prompt: under load, with speculation known to save nothing per token. Asked
    /// before a prefill, so that a request that will not draft does not have the verifier
    /// build the drafter's carry.
    pub fn declines_every_open(&self) -> bool {
        let judged = self.judge_open(0, 0);
        judged.active > 1
            && judged.cost.is_some()
            && judged.saving.is_some_and(|saving| saving <= 0.0)
    }

    fn judge_open(&self, prompt_len: usize, cached: usize) -> OpenJudgement {
        let active = self.active.load(Ordering::Relaxed).max(1);
        let queue = self.queue_length(active);
        let estimates = self.lock();
        let saving = per_token_saving(&estimates, active, queue, self.max_block_size);
        let held = estimates.open_reuse.0.unwrap_or(1.0) * cached.min(prompt_len) as f64;
        let positions = prompt_len as f64 - held;
        OpenJudgement {
            active,
            saving,
            cost: estimates.open_per_token.0.map(|open| open * positions),
            positions,
        }
    }

    /// Draft calls one drafter runs in turn when `concurrent` requests draft at once.
    fn queue_length(&self, concurrent: usize) -> usize {
        match self.drafter_parallelism.load(Ordering::Relaxed) {
            0 => 1,
            parallel => concurrent.max(1).div_ceil(parallel),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Estimates> {
        lock(&self.estimates)
    }

    fn decide(&self, estimates: &Estimates) {
        let active = self.active.load(Ordering::Relaxed);
        let cap = best_block_size(
            estimates,
            active,
            self.queue_length(active),
            self.max_block_size,
        );
        let cap = cap.filter(|&c| c < self.max_block_size);
        let encoded = cap.map_or(0, |c| c.saturating_add(1));
        if self.cap.swap(encoded, Ordering::Relaxed) != encoded {
            metrics::gauge!(SPECULATION_CAP).set(cap.unwrap_or(0) as f64);
        }
    }
}

/// Seconds per token speculation at its best size saves over plain decoding for `active`
/// requests together (negative when it costs more); `None` while a cost is unknown. A
/// request alone is judged on whole rounds of requests that were alone, when measured.
fn per_token_saving(
    estimates: &Estimates,
    active: usize,
    queue: usize,
    max_block_size: usize,
) -> Option<f64> {
    if active == 1 {
        let rounds = &estimates.rounds;
        let plain = rounds.verify(1).filter(|_| rounds.has_verify(1));
        // Only sizes that ran: an interpolated one is no measurement.
        let spec = (2..=max_block_size)
            .filter(|&block| rounds.has_verify(block))
            .filter_map(|block| {
                let drafting = rounds.draft_step()? * (block - 1) as f64;
                let emitted = estimates.acceptance.expected_emitted(block)?;
                Some((drafting + rounds.verify(block)?) / emitted)
            })
            .min_by(f64::total_cmp);
        if let (Some(plain), Some(spec)) = (plain, spec) {
            return Some(plain - spec);
        }
    }
    let plain = estimates.forward.seconds(active)? / active as f64;
    let (_, spec) = cheapest_speculative(estimates, active, queue, max_block_size)?;
    Some(plain - spec)
}

/// The speculative block size with the fewest seconds per token for `active` requests
/// together, and that cost; `None` while a cost is unknown.
fn cheapest_speculative(
    estimates: &Estimates,
    active: usize,
    queue: usize,
    max_block_size: usize,
) -> Option<(usize, f64)> {
    let n = active.max(1) as f64;
    let draft_step = estimates.rounds.draft_step()?;
    let mut best: Option<(usize, f64)> = None;
    for block in 2..=max_block_size {
        let forward = estimates.forward.seconds(active.saturating_mul(block))?;
        let drafting = draft_step * (block - 1) as f64 * queue as f64;
        let emitted = estimates.acceptance.expected_emitted(block)?;
        let cost = (forward + drafting) / (n * emitted);
        if best.is_none_or(|(_, best_cost)| cost < best_cost) {
            best = Some((block, cost));
        }
    }
    best
}

/// The block size with the fewest seconds per token for `active` requests together, when
/// draft calls queue `queue` deep; `None` for one request alone or while a cost is unknown.
fn best_block_size(
    estimates: &Estimates,
    active: usize,
    queue: usize,
    max_block_size: usize,
) -> Option<usize> {
    if active <= 1 {
        return None;
    }
    let plain = estimates.forward.seconds(active)? / active as f64;
    let best = cheapest_speculative(estimates, active, queue, max_block_size);
    match best {
        Some((block, cost)) if cost < plain * SPECULATION_MARGIN => Some(block),
        _ => Some(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(value: f64) -> Duration {
        Duration::from_secs_f64(value / 1000.0)
    }

    /// Feeds forwards costing `base + per_token × t` ms for every `t` up to 256, draft steps
    /// of `draft_ms` measured alone, and rounds of 4 drafts accepting `accepted`.
    fn learned(
        governor: &SpeculationGovernor,
        base: f64,
        per_token: f64,
        draft_ms: f64,
        accepted: usize,
    ) {
        // Forwards of two rows: what requests alone cost end to end stays unmeasured.
        for tokens in [2, 4, 5, 8, 16, 20, 32, 64, 128, 256] {
            governor.record(&GovernedRound {
                forward: Some(ForwardCost {
                    tokens,
                    rows: 2,
                    time: ms(base + per_token * tokens as f64),
                }),
                ..GovernedRound::default()
            });
        }
        for _ in 0..50 {
            governor.record(&GovernedRound {
                draft: Some((4, ms(draft_ms * 4.0), 1)),
                forward: None,
                verify_time: Duration::ZERO,
                drafted: 4,
                accepted,
            });
        }
    }

    #[test]
    fn one_request_is_left_to_its_own_policy() {
        let governor = SpeculationGovernor::new(1, 5);
        learned(&governor, 10.0, 20.0, 30.0, 0);
        governor.set_active(1);
        assert_eq!(governor.cap(), None);
        governor.set_active(0);
        assert_eq!(governor.cap(), None);
    }

    #[test]
    fn nothing_is_capped_before_costs_are_known() {
        let governor = SpeculationGovernor::new(1, 5);
        governor.set_active(8);
        assert_eq!(governor.cap(), None);
    }

    #[test]
    fn compute_bound_forwards_switch_speculation_off_under_load() {
        // A CPU: every token costs nearly a full step, drafts a third of one.
        let governor = SpeculationGovernor::new(1, 5);
        learned(&governor, 60.0, 30.0, 34.0, 3);
        governor.set_active(1);
        assert_eq!(governor.cap(), None);
        governor.set_active(4);
        assert_eq!(governor.cap(), Some(1));
        governor.set_active(32);
        assert_eq!(governor.cap(), Some(1));
    }

    #[test]
    fn flat_forwards_and_cheap_drafts_keep_speculating_under_load() {
        // An accelerator: a forward of a few hundred tokens costs what one of a few does.
        let governor = SpeculationGovernor::new(0, 5);
        learned(&governor, 20.0, 0.01, 0.5, 4);
        governor.set_active(16);
        assert_eq!(governor.cap(), None);
    }

    #[test]
    fn the_cap_shrinks_as_load_grows_and_lifts_when_it_falls() {
        // Forwards nearly flat, one drafter whose queue grows with the load.
        let governor = SpeculationGovernor::new(1, 5);
        learned(&governor, 40.0, 0.5, 1.0, 3);
        let mut last = usize::MAX;
        for active in [2, 4, 8, 16, 32, 128] {
            governor.set_active(active);
            let cap = governor.cap().unwrap_or(5);
            assert!(cap <= last, "active {active}: {cap} after {last}");
            last = cap;
        }
        assert_eq!(last, 1, "128 requests queue on one drafter");
        governor.set_active(2);
        assert_eq!(governor.cap(), Some(4), "a fifth token is never accepted");
    }

    #[test]
    fn short_requests_skip_a_drafter_that_cannot_pay_back_its_prefill() {
        // One request alone: a speculative token costs 40 ms against 100 ms plain.
        let governor = SpeculationGovernor::new(1, 5);
        learned(&governor, 90.0, 10.0, 10.0, 4);
        governor.set_active(1);
        assert!(governor.worth_opening(100, 0, 4), "no opening measured yet");
        // Opening prefills the prompt at 20 ms per token: 2 s for 100 tokens.
        governor.record_open(&OpenCost::cold(100, ms(2000.0)));
        assert!(governor.worth_opening(100, 0, 64), "64 tokens save ~3.8 s");
        let declined: Vec<bool> = (0..RELEARN_EVERY)
            .map(|_| governor.worth_opening(100, 0, 16))
            .collect();
        assert_eq!(
            declined.iter().filter(|&&open| open).count(),
            1,
            "16 tokens save ~1 s: declined, but for one relearning request"
        );
        // Under load plain rows share the forward: nothing is worth opening for.
        learned(&governor, 90.0, 100.0, 100.0, 1);
        governor.set_active(8);
        assert_eq!(governor.cap(), Some(1));
        let opened = (0..2 * RELEARN_EVERY).filter(|_| governor.worth_opening(10, 0, 1000));
        assert_eq!(
            opened.count(),
            0,
            "no relearning while the load keeps rounds plain"
        );
    }

    #[test]
    fn under_load_an_unknown_cost_opens_one_session_in_relearn_every() {
        let governor = SpeculationGovernor::new(1, 5);
        governor.set_active(1);
        assert!(
            (0..RELEARN_EVERY).all(|_| governor.worth_opening(100, 0, 64)),
            "a request alone learns the costs"
        );
        governor.set_active(4);
        let opened = (0..2 * RELEARN_EVERY).filter(|_| governor.worth_opening(100, 0, 64));
        assert_eq!(
            opened.count(),
            2,
            "one session in {RELEARN_EVERY} learns them"
        );
    }

    #[test]
    fn a_request_alone_is_judged_on_whole_rounds_of_requests_alone() {
        // The forwards say speculation saves 64 ms a token...
        let governor = SpeculationGovernor::new(1, 5);
        learned(&governor, 90.0, 10.0, 10.0, 4);
        governor.set_active(1);
        governor.record_open(&OpenCost::cold(10, ms(100.0)));
        assert!(governor.worth_opening(10, 0, 64));
        // ...but whole rounds of requests alone, acceptance on the logits and the round
        // trip included, cost 100 ms plain and 600 ms for a block of 5.
        for (block, wall) in [(1, 100.0), (5, 600.0)] {
            for _ in 0..50 {
                governor.record(&GovernedRound {
                    forward: Some(ForwardCost {
                        tokens: block,
                        rows: 1,
                        time: ms(90.0 + 10.0 * block as f64),
                    }),
                    verify_time: ms(wall),
                    draft: None,
                    drafted: block - 1,
                    accepted: block - 1,
                });
            }
        }
        let opened = (0..RELEARN_EVERY).filter(|_| governor.worth_opening(10, 0, 64));
        assert_eq!(
            opened.count(),
            1,
            "declined, but for one relearning request"
        );
    }

    #[test]
    fn a_few_lucky_rounds_promise_little_and_many_promise_what_they_showed() {
        let mut acceptance = PooledAcceptance::default();
        assert_eq!(acceptance.expected_emitted(4), None);
        acceptance.record(3, 3);
        assert_eq!(
            acceptance.expected_emitted(4),
            None,
            "one round is no evidence"
        );
        for _ in 0..20 {
            acceptance.record(3, 3);
        }
        let lucky = acceptance.expected_emitted(4).unwrap_or(0.0);
        assert!(lucky < 3.8, "21 rounds of 3 accepted drafts: {lucky}");
        for _ in 0..500 {
            acceptance.record(3, 3);
        }
        let steady = acceptance.expected_emitted(4).unwrap_or(0.0);
        assert!(steady > 3.9, "{steady}");
        for _ in 0..500 {
            acceptance.record(3, 0);
        }
        let fallen = acceptance.expected_emitted(4).unwrap_or(0.0);
        assert!(fallen < 1.05, "recent rounds count most: {fallen}");
    }

    #[test]
    fn a_short_first_request_does_not_switch_speculation_off() {
        // Plain rounds cost 50 ms; a first short request ran two speculative rounds of a
        // 3-draft block whose first draft was rejected.
        let governor = SpeculationGovernor::new(1, 4);
        governor.set_active(1);
        governor.record_open(&OpenCost::cold(40, ms(200.0)));
        let round = |block: usize, wall: f64, accepted: usize| GovernedRound {
            draft: (block > 1).then(|| (block - 1, ms(15.0 * (block - 1) as f64), 1)),
            forward: Some(ForwardCost {
                tokens: block,
                rows: 1,
                time: ms(wall),
            }),
            verify_time: ms(wall),
            drafted: block - 1,
            accepted,
        };
        for _ in 0..6 {
            governor.record(&round(1, 50.0, 0));
        }
        for _ in 0..2 {
            governor.record(&round(4, 62.0, 0));
        }
        assert!(
            governor.worth_opening(40, 0, 48),
            "two rounds are no evidence"
        );
        // Many rounds that never accept a draft are.
        for _ in 0..40 {
            governor.record(&round(4, 62.0, 0));
        }
        let opened = (0..RELEARN_EVERY).filter(|_| governor.worth_opening(40, 0, 48));
        assert_eq!(
            opened.count(),
            1,
            "declined, but for one relearning request"
        );
    }

    #[test]
    fn an_open_is_priced_on_the_positions_the_drafter_computes() {
        // Alone, a speculative token costs 40 ms against 100 ms plain; a cold open of 1,500
        // tokens took 3 s (2 ms a token): 32 new tokens (~1.9 s saved) do not pay for it.
        let governor = SpeculationGovernor::new(1, 5);
        learned(&governor, 90.0, 10.0, 10.0, 4);
        governor.set_active(1);
        governor.record_open(&OpenCost::cold(1500, ms(3000.0)));
        let declined = (0..RELEARN_EVERY - 1).filter(|_| governor.worth_opening(1550, 0, 32));
        assert_eq!(declined.count(), 0, "a cold prompt is declined");
        // The next turn's prompt: the verifier held 1,500 of its 1,550 tokens. Until an
        // open after a cache hit is seen, the drafter is taken to hold them too.
        assert!(
            governor.worth_opening(1550, 1500, 32),
            "50 tokens to compute"
        );
        // A draft model that held them: the 50 it computed took 100 ms.
        governor.record_open(&OpenCost {
            prompt: 1550,
            verifier_cached: 1500,
            computed: 50,
            time: ms(100.0),
        });
        assert!(governor.worth_opening(1600, 1550, 32));
        // An open of a few positions teaches no price per position: its 5 ms are a call's.
        governor.record_open(&OpenCost {
            prompt: 1600,
            verifier_cached: 1599,
            computed: 1,
            time: ms(5.0),
        });
        let per_position = governor.lock().open_per_token.0.unwrap_or(f64::NAN);
        assert!((per_position - 0.002).abs() < 1e-9, "{per_position}");
        // An MTP drafter receives every position in its snapshot, cached or not.
        let snapshot = SpeculationGovernor::new(1, 5);
        learned(&snapshot, 90.0, 10.0, 10.0, 4);
        snapshot.set_active(1);
        for _ in 0..30 {
            snapshot.record_open(&OpenCost {
                prompt: 1550,
                verifier_cached: 1500,
                computed: 1550,
                time: ms(3100.0),
            });
        }
        let opened = (0..RELEARN_EVERY).filter(|_| snapshot.worth_opening(1600, 1550, 32));
        assert_eq!(
            opened.count(),
            1,
            "declined, but for one relearning request"
        );
    }

    #[test]
    fn only_a_loaded_process_whose_speculation_saves_nothing_declines_before_prefill() {
        let governor = SpeculationGovernor::new(1, 5);
        governor.set_active(4);
        assert!(!governor.declines_every_open(), "nothing measured yet");
        learned(&governor, 90.0, 100.0, 100.0, 1);
        governor.set_active(8);
        assert_eq!(governor.cap(), Some(1));
        governor.record_open(&OpenCost::cold(100, ms(200.0)));
        assert!(governor.declines_every_open());
        assert!(!governor.worth_opening(1, 1, 1000));
        governor.set_active(1);
        assert!(
            !governor.declines_every_open(),
            "alone, one declined request in {RELEARN_EVERY} relearns"
        );
    }

    #[test]
    fn drafts_that_queue_on_one_drafter_count_once_per_step() {
        let governor = Arc::new(SpeculationGovernor::new(1, 5));
        let drafting: Vec<_> = (0..3).map(|_| governor.drafting()).collect();
        assert_eq!(drafting.last().map(|d| d.concurrent), Some(3));
        drop(drafting);
        assert_eq!(governor.drafting().concurrent, 1);
        // Three calls queued: 90 ms for 1 step is 30 ms of the drafter's own.
        governor.record(&GovernedRound {
            draft: Some((1, ms(90.0), 3)),
            forward: None,
            verify_time: Duration::ZERO,
            drafted: 1,
            accepted: 1,
        });
        let step = governor.lock().rounds.draft_step();
        assert!(step.is_some_and(|s| (s - 0.030).abs() < 1e-9), "{step:?}");
    }
}
