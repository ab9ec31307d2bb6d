//! Whether draft-model drafters pre-draft: overlap the next round's drafting with this
//! round's verify, or take turns.
//!
//! A pre-draft pays when the draft calls it saves (a hit answers at once) are worth more
//! than what it slows the verify it runs beside. On cores of its own a drafter's pre-draft
//! is nearly free; on the verifier's cores it takes them from that verify, and a miss wastes
//! them. Configuration cannot tell which, so in [`OverlapMode::Auto`] the router measures it
//! per drafter: each round's cost (the wall time from a draft call's answer to the next
//! call, which is the verify and its bookkeeping, plus that next call's own time) is booked
//! per verified row under whether a pre-draft ran beside it. The mode in use runs for a
//! while; then the other is probed for a few rounds and the cheaper kept, pre-drafting only
//! when it is cheaper by [`PAYS_BY`]. A drafter on a verifier's cores (one machine, a CPU in
//! common, as both report in Stats) starts without pre-drafting; any other starts with it.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use specd_core::sync::lock;
use std::sync::Mutex;
use tracing::info;

/// The operator's choice of overlap (`--overlap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverlapMode {
    /// Pre-draft while the measurements say it pays.
    Auto,
    /// Always pre-draft.
    On,
    /// Never pre-draft.
    Off,
}

/// Rounds a new drafter runs in its first mode before the other is probed; a drafter on a
/// verifier's cores waits [`REPROBE_AFTER`] rounds instead, as after a confirming probe: that
/// pre-drafts cost there is the likely case, and a probe's rounds are paid by the requests
/// running them (the first requests of a new router).
pub const FIRST_PROBE_AFTER: u32 = 12;
/// Rounds a probe of the other mode lasts.
pub const PROBE_ROUNDS: u32 = 12;
/// Rounds between probes after a decision; doubled (up to [`MAX_REPROBE_AFTER`]) each time a
/// probe confirms it, back to this after a switch.
pub const REPROBE_AFTER: u32 = 128;
pub const MAX_REPROBE_AFTER: u32 = 1024;
/// Pre-drafting must cost this fraction less per row than taking turns to be chosen.
pub const PAYS_BY: f64 = 0.03;
/// A probe whose first [`EARLY_VERDICT_ROUNDS`] rounds cost this fraction more per row than
/// the mode in use ends there, confirming it: on a verifier's cores a pre-draft that misses
/// slows the verify beside it and is drafted again, so each probe round can cost half a
/// round more, and twelve of them on prose (where most pre-drafts miss) cost a request
/// several percent. A probe that looks better runs its whole length before a switch.
pub const CLEARLY_WORSE_BY: f64 = 0.20;
pub const EARLY_VERDICT_ROUNDS: u32 = 4;
/// Rounds of the mode in use that a probe is compared with (the most recent).
const COMPARED_ROUNDS: usize = 24;

/// One round as a drafter session saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundCost {
    /// A pre-draft ran beside the round's verify.
    pub predrafted: bool,
    /// Tokens the round verified (its drafts and the bonus).
    pub rows: usize,
    /// From the draft call's answer to the next call: the verify and its bookkeeping.
    pub verify: Duration,
    /// The next draft call (short when it found the pre-draft).
    pub draft: Duration,
}

/// The router's overlap decisions, one per drafter.
#[derive(Debug)]
pub struct Overlap {
    mode: OverlapMode,
    judges: Mutex<HashMap<String, Judge>>,
}

impl Overlap {
    pub fn new(mode: OverlapMode) -> Self {
        Self {
            mode,
            judges: Mutex::default(),
        }
    }

    /// Whether a draft call to `drafter` should ask for a pre-draft now. `shares_cores`
    /// (asked once per drafter) says whether it runs on a verifier's cores, when known.
    pub fn predraft(&self, drafter: &str, shares_cores: impl FnOnce() -> Option<bool>) -> bool {
        match self.mode {
            OverlapMode::On => true,
            OverlapMode::Off => false,
            OverlapMode::Auto => {
                let mut judges = lock(&self.judges);
                if let Some(judge) = judges.get(drafter) {
                    return judge.current();
                }
                let start = shares_cores() != Some(true);
                info!(
                    drafter,
                    predraft = start,
                    "starting overlap (pre-drafting) {}",
                    if start {
                        "on"
                    } else {
                        "off: the drafter shares the verifier's cores"
                    }
                );
                let first_probe = if start {
                    FIRST_PROBE_AFTER
                } else {
                    REPROBE_AFTER
                };
                judges.insert(drafter.to_owned(), Judge::new(start, first_probe));
                start
            }
        }
    }

    /// Books a round drafted by `drafter`.
    pub fn record(&self, drafter: &str, round: RoundCost) {
        if self.mode != OverlapMode::Auto || round.rows == 0 {
            return;
        }
        if let Some(judge) = lock(&self.judges).get_mut(drafter) {
            judge.record(drafter, round);
        }
    }

    /// Decisions (not probes) to switch pre-drafting on or off so far, over all drafters.
    pub fn switches(&self) -> u64 {
        lock(&self.judges).values().map(|j| j.switches).sum()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Running the decided mode; the other is probed after `left` more of its rounds.
    Settled { left: u32 },
    /// Running the other mode for `left` more rounds.
    Probing { left: u32 },
}

/// One drafter's decision and the measurements behind it.
#[derive(Debug)]
struct Judge {
    /// Pre-drafting, as last decided.
    decided: bool,
    phase: Phase,
    /// Rounds between probes, now.
    reprobe_after: u32,
    /// Recent rounds in the decided mode.
    settled: VecDeque<RoundCost>,
    /// Rounds of the probe in progress.
    probed: Vec<RoundCost>,
    switches: u64,
}

impl Judge {
    fn new(predraft: bool, first_probe_after: u32) -> Self {
        Self {
            decided: predraft,
            phase: Phase::Settled {
                left: first_probe_after,
            },
            reprobe_after: REPROBE_AFTER,
            settled: VecDeque::with_capacity(COMPARED_ROUNDS),
            probed: Vec::with_capacity(PROBE_ROUNDS as usize),
            switches: 0,
        }
    }

    fn current(&self) -> bool {
        match self.phase {
            Phase::Settled { .. } => self.decided,
            Phase::Probing { .. } => !self.decided,
        }
    }

    fn record(&mut self, drafter: &str, round: RoundCost) {
        // Rounds asked for under the previous phase are booked nowhere: a probe compares
        // rounds that ran in one mode each, close together.
        if round.predrafted != self.current() {
            return;
        }
        match &mut self.phase {
            Phase::Settled { left } => {
                if self.settled.len() == COMPARED_ROUNDS {
                    self.settled.pop_front();
                }
                self.settled.push_back(round);
                *left = left.saturating_sub(1);
                if *left == 0 {
                    self.probed.clear();
                    self.phase = Phase::Probing { left: PROBE_ROUNDS };
                }
            }
            Phase::Probing { left } => {
                self.probed.push(round);
                *left = left.saturating_sub(1);
                if *left == 0 || self.probe_clearly_loses() {
                    self.decide(drafter);
                }
            }
        }
    }

    fn probe_clearly_loses(&self) -> bool {
        self.probed.len() >= EARLY_VERDICT_ROUNDS as usize
            && PerRow::of(self.probed.iter()).total()
                > PerRow::of(self.settled.iter()).total() * (1.0 + CLEARLY_WORSE_BY)
    }

    /// Ends a probe: keeps the cheaper mode per row.
    fn decide(&mut self, drafter: &str) {
        let kept = PerRow::of(self.settled.iter());
        let probed = PerRow::of(self.probed.iter());
        let (on, off) = if self.decided {
            (kept.total(), probed.total())
        } else {
            (probed.total(), kept.total())
        };
        let predraft = on < off * (1.0 - PAYS_BY);
        if predraft != self.decided {
            self.switches += 1;
            specd_telemetry::record::overlap_switch(predraft);
            info!(
                drafter,
                predraft,
                on_ms_per_row = 1e3 * on,
                off_ms_per_row = 1e3 * off,
                kept_verify_ms_per_row = 1e3 * kept.verify,
                kept_draft_ms_per_row = 1e3 * kept.draft,
                probed_verify_ms_per_row = 1e3 * probed.verify,
                probed_draft_ms_per_row = 1e3 * probed.draft,
                "overlap (pre-drafting) switched {}",
                if predraft { "on" } else { "off" }
            );
            self.decided = predraft;
            self.settled = self.probed.drain(..).collect();
            self.reprobe_after = REPROBE_AFTER;
        } else {
            tracing::debug!(
                drafter,
                predraft,
                on_ms_per_row = 1e3 * on,
                off_ms_per_row = 1e3 * off,
                "overlap probe kept the decision"
            );
            self.reprobe_after = (self.reprobe_after * 2).min(MAX_REPROBE_AFTER);
        }
        self.phase = Phase::Settled {
            left: self.reprobe_after,
        };
    }
}

/// Seconds per verified row over some rounds, of the verifies and of the draft calls.
#[derive(Debug, Clone, Copy)]
struct PerRow {
    verify: f64,
    draft: f64,
}

impl PerRow {
    /// The rounds' totals over their rows; infinite for none, so that a mode never measured
    /// is never chosen over one that was.
    fn of<'a>(rounds: impl Iterator<Item = &'a RoundCost>) -> Self {
        let (verify, draft, rows) = rounds.fold((0.0, 0.0, 0usize), |(v, d, n), round| {
            (
                v + round.verify.as_secs_f64(),
                d + round.draft.as_secs_f64(),
                n + round.rows,
            )
        });
        if rows == 0 {
            return Self {
                verify: f64::INFINITY,
                draft: f64::INFINITY,
            };
        }
        let rows = rows as f64;
        Self {
            verify: verify / rows,
            draft: draft / rows,
        }
    }

    fn total(self) -> f64 {
        self.verify + self.draft
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(value: f64) -> Duration {
        Duration::from_secs_f64(value / 1000.0)
    }

    /// Runs `rounds` rounds of 4 rows on `drafter`, each costing what `cost(predrafted)`
    /// says (verify ms, draft ms); returns how many asked for a pre-draft.
    fn run(
        overlap: &Overlap,
        drafter: &str,
        shares: Option<bool>,
        rounds: usize,
        cost: impl Fn(bool) -> (f64, f64),
    ) -> usize {
        let mut on = 0;
        for _ in 0..rounds {
            let predrafted = overlap.predraft(drafter, || shares);
            on += usize::from(predrafted);
            let (verify, draft) = cost(predrafted);
            overlap.record(
                drafter,
                RoundCost {
                    predrafted,
                    rows: 4,
                    verify: ms(verify),
                    draft: ms(draft),
                },
            );
        }
        on
    }

    /// On shared cores: a pre-draft slows the verify by more than the draft call it saves.
    fn contended(predrafted: bool) -> (f64, f64) {
        if predrafted {
            (70.0, 12.0)
        } else {
            (50.0, 20.0)
        }
    }

    /// On cores of its own: a pre-draft costs the verify nothing and saves most draft calls.
    fn separate(predrafted: bool) -> (f64, f64) {
        if predrafted {
            (50.0, 4.0)
        } else {
            (50.0, 20.0)
        }
    }

    #[test]
    fn fixed_modes_ignore_measurements() {
        let on = Overlap::new(OverlapMode::On);
        assert_eq!(run(&on, "d", Some(true), 500, contended), 500);
        let off = Overlap::new(OverlapMode::Off);
        assert_eq!(run(&off, "d", Some(false), 500, separate), 0);
        assert_eq!(on.switches() + off.switches(), 0);
    }

    #[test]
    fn a_drafter_on_the_verifiers_cores_starts_off_and_stays_off_when_overlap_costs() {
        let overlap = Overlap::new(OverlapMode::Auto);
        let first = run(&overlap, "d", Some(true), REPROBE_AFTER as usize, contended);
        assert_eq!(first, 0, "no probe before {REPROBE_AFTER} rounds");
        let on = run(&overlap, "d", Some(true), 1000, contended);
        assert_eq!(overlap.switches(), 0);
        // Only probes pre-draft: a few rounds in a hundred.
        assert!(on > 0 && on < 100, "{on} of 1000 rounds pre-drafted");
    }

    #[test]
    fn a_probe_that_clearly_loses_ends_early_and_confirms_the_decision() {
        // A pre-draft that doubles the verify beside it: 45 % more per row than taking turns.
        let starved = |predrafted| {
            if predrafted {
                (90.0, 12.0)
            } else {
                (50.0, 20.0)
            }
        };
        let overlap = Overlap::new(OverlapMode::Auto);
        let first_probe_ends = REPROBE_AFTER + EARLY_VERDICT_ROUNDS;
        let on = run(
            &overlap,
            "d",
            Some(true),
            first_probe_ends as usize,
            starved,
        );
        assert_eq!(on, EARLY_VERDICT_ROUNDS as usize);
        // The confirmed decision waits twice as long for the next probe.
        let on = run(
            &overlap,
            "d",
            Some(true),
            2 * REPROBE_AFTER as usize,
            starved,
        );
        assert_eq!(on, 0);
        let on = run(&overlap, "d", Some(true), PROBE_ROUNDS as usize, starved);
        assert_eq!(on, EARLY_VERDICT_ROUNDS as usize);
        assert_eq!(overlap.switches(), 0);
        assert!(!overlap.predraft("d", || None));
    }

    #[test]
    fn a_drafter_that_costs_the_verifier_nothing_starts_on_and_stays_on() {
        let overlap = Overlap::new(OverlapMode::Auto);
        let on = run(&overlap, "d", Some(false), 1000, separate);
        assert_eq!(overlap.switches(), 0);
        assert!(on > 900, "{on} of 1000 rounds pre-drafted");
    }

    #[test]
    fn a_wrong_start_is_corrected_after_the_first_probe() {
        // Placement unknown: it starts on, and overlap costs here.
        let overlap = Overlap::new(OverlapMode::Auto);
        let first = run(
            &overlap,
            "d",
            None,
            (FIRST_PROBE_AFTER + PROBE_ROUNDS) as usize,
            contended,
        );
        assert_eq!(first, FIRST_PROBE_AFTER as usize);
        assert_eq!(overlap.switches(), 1);
        assert!(!overlap.predraft("d", || None));
        // Shares cores by its Stats, but the cores are idle: overlap pays.
        let other = Overlap::new(OverlapMode::Auto);
        let first_probe_ends = REPROBE_AFTER + PROBE_ROUNDS;
        run(&other, "d", Some(true), first_probe_ends as usize, separate);
        assert_eq!(other.switches(), 1);
        assert!(other.predraft("d", || None));
    }

    #[test]
    fn a_change_of_conditions_is_followed_by_the_next_probe() {
        let overlap = Overlap::new(OverlapMode::Auto);
        run(&overlap, "d", Some(false), 300, separate);
        assert!(overlap.predraft("d", || None));
        // Another service moved onto the drafter's cores.
        run(
            &overlap,
            "d",
            None,
            (2 * MAX_REPROBE_AFTER + PROBE_ROUNDS) as usize,
            contended,
        );
        assert_eq!(overlap.switches(), 1);
        assert!(!overlap.predraft("d", || None));
    }

    #[test]
    fn drafters_are_judged_apart_and_close_calls_do_not_predraft() {
        let overlap = Overlap::new(OverlapMode::Auto);
        run(&overlap, "near", Some(true), 200, contended);
        run(&overlap, "far", Some(false), 200, separate);
        assert!(!overlap.predraft("near", || None));
        assert!(overlap.predraft("far", || None));
        // Overlap 1% cheaper: not worth the risk.
        let close = Overlap::new(OverlapMode::Auto);
        run(&close, "d", Some(false), 100, |predrafted| {
            if predrafted {
                (59.4, 20.0)
            } else {
                (60.0, 20.0)
            }
        });
        assert!(!close.predraft("d", || None));
    }

    #[test]
    fn rounds_asked_under_another_phase_are_not_booked() {
        let mut judge = Judge::new(true, FIRST_PROBE_AFTER);
        let round = |predrafted| RoundCost {
            predrafted,
            rows: 4,
            verify: ms(1.0),
            draft: ms(1.0),
        };
        judge.record("d", round(false));
        assert_eq!(judge.settled.len(), 0);
        judge.record("d", round(true));
        assert_eq!(judge.settled.len(), 1);
        assert_eq!(PerRow::of(std::iter::empty()).total(), f64::INFINITY);
    }
}
