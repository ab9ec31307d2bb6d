//! When the sequences a forward just answered are expected back with their next row.
//!
//! A sequence in its round loop sends its next row as soon as its caller has handled the
//! answer: within a fraction of a millisecond in the one-process server, but a gRPC round
//! trip (and the router's turn on a busy CPU) later when the router is another process. A
//! forward that leaves such a row out costs that row a forward of its own later, so the
//! batch waits for rows whose return it expects soon: at most a share of a forward's time,
//! and only for sequences whose own measured return time fits in it (a sequence drafting
//! between its rounds comes back much later and is not waited for).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use specd_core::SeqId;

/// The longest wait for expected rows, as a share of the last forward's time.
const WAIT_SHARE: u32 = 4;

/// Margin on a sequence's expected return: a quarter of its return time plus this.
const SLACK: Duration = Duration::from_micros(250);

/// A sequence not heard from for this long is forgotten (it was released or went idle).
const FORGET_AFTER: Duration = Duration::from_secs(10);

/// A row coming back later than this after its answer did not come straight back (its
/// request waited elsewhere): it teaches nothing about return times.
const LONGEST_RETURN: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy)]
struct Seen {
    /// When its last answer went out, while its next row has not arrived.
    answered: Option<Instant>,
    /// How long its rows take to come back (a moving average).
    gap: Option<Duration>,
    last_seen: Instant,
}

/// Per sequence, when its last answer went out and how long its rows take to come back.
#[derive(Debug, Default)]
pub(crate) struct Returns {
    seen: HashMap<SeqId, Seen>,
    /// When the last forward answered its rows, and how long it took.
    last_forward: Option<(Instant, Duration)>,
}

impl Returns {
    /// A row of `seq` queued at `at`.
    pub(crate) fn arrived(&mut self, seq: SeqId, at: Instant) {
        let seen = self.heard_from(seq, at);
        if let Some(answered) = seen.answered.take() {
            let gap = at.saturating_duration_since(answered);
            if gap <= LONGEST_RETURN {
                seen.gap = Some(match seen.gap {
                    Some(before) => (before + gap) / 2,
                    None => gap,
                });
            }
        }
    }

    /// A forward of `forward`'s duration answered `seqs` at `at`.
    pub(crate) fn answered(
        &mut self,
        seqs: impl IntoIterator<Item = SeqId>,
        at: Instant,
        forward: Duration,
    ) {
        self.last_forward = Some((at, forward));
        for seq in seqs {
            self.heard_from(seq, at).answered = Some(at);
        }
        self.seen
            .retain(|_, seen| at.saturating_duration_since(seen.last_seen) < FORGET_AFTER);
    }

    /// `seq`'s record, heard from at `at`.
    fn heard_from(&mut self, seq: SeqId, at: Instant) -> &mut Seen {
        let seen = self.seen.entry(seq).or_insert(Seen {
            answered: None,
            gap: None,
            last_seen: at,
        });
        seen.last_seen = at;
        seen
    }

    /// Until when the next forward should wait for rows expected back: the latest expected
    /// return still to come after `now`, within a [`WAIT_SHARE`]th of the last forward's
    /// time from its end (rows that queued during that forward wait too: run alone, they
    /// would stay a forward behind the others for good); `None` where none is.
    pub(crate) fn expected_by(&self, now: Instant) -> Option<Instant> {
        let (ended, took) = self.last_forward?;
        let cap = ended + took / WAIT_SHARE;
        self.seen
            .values()
            .filter_map(|seen| {
                let expected = seen.answered? + seen.gap? + seen.gap? / 4 + SLACK;
                (expected > now && expected <= cap).then_some(expected)
            })
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_row_expected_within_a_share_of_the_forward_is_waited_for() {
        let t0 = Instant::now();
        let (a, b) = (SeqId(1), SeqId(2));
        let mut returns = Returns::default();
        // Both rows came back 2 ms after their answers once.
        returns.answered([a, b], t0, 40 * MS);
        returns.arrived(a, t0 + 2 * MS);
        returns.arrived(b, t0 + 2 * MS);
        let answered = t0 + 50 * MS;
        returns.answered([a, b], answered, 40 * MS);
        // a is back; b is expected 2.75 ms after its answer, within 10 ms of it.
        returns.arrived(a, answered + MS);
        let wait = returns.expected_by(answered + MS);
        assert_eq!(wait, Some(answered + 2 * MS + MS / 2 + SLACK));
        // Once b is back nothing is expected.
        returns.arrived(b, answered + 2 * MS);
        assert_eq!(returns.expected_by(answered + 2 * MS), None);
    }

    #[test]
    fn rows_expected_late_or_never_measured_are_not_waited_for() {
        let t0 = Instant::now();
        let (drafting, fresh) = (SeqId(1), SeqId(2));
        let mut returns = Returns::default();
        returns.answered([drafting], t0, 40 * MS);
        // It drafts for 50 ms between its rounds: longer than a quarter of a forward.
        returns.arrived(drafting, t0 + 50 * MS);
        returns.answered([drafting, fresh], t0 + 100 * MS, 40 * MS);
        assert_eq!(returns.expected_by(t0 + 101 * MS), None);
        // A row past the expected time is not waited for any more.
        returns.arrived(drafting, t0 + 103 * MS);
        returns.answered([drafting], t0 + 150 * MS, 400 * MS);
        assert!(returns.expected_by(t0 + 150 * MS).is_some());
        assert_eq!(returns.expected_by(t0 + 250 * MS), None);
    }

    #[test]
    fn a_return_after_a_long_pause_teaches_nothing() {
        let t0 = Instant::now();
        let seq = SeqId(7);
        let mut returns = Returns::default();
        returns.answered([seq], t0, 40 * MS);
        returns.arrived(seq, t0 + 5 * LONGEST_RETURN);
        returns.answered([seq], t0 + 6 * LONGEST_RETURN, 40 * MS);
        let at = t0 + 6 * LONGEST_RETURN;
        assert_eq!(returns.expected_by(at), None);
    }

    #[test]
    fn sequences_not_heard_from_are_forgotten() {
        let t0 = Instant::now();
        let mut returns = Returns::default();
        returns.answered([SeqId(1)], t0, 40 * MS);
        returns.answered([SeqId(2)], t0 + FORGET_AFTER, 40 * MS);
        assert_eq!(returns.seen.len(), 1);
    }
}
