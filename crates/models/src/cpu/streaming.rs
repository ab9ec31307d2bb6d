//! How a single pass over the weights asks for its lines, chosen on the machine it runs on.
//!
//! Lines read once can be asked for as non-temporal or into the second-level cache. Which
//! keeps more of the read bandwidth differs between CPUs by up to 1.6x (see
//! [`Prefetch::OnceL2`]), and neither the vendor nor the model settles it, so the process
//! measures: its first single-pass matmul regions take the two hints in turn, each timed
//! against the weight bytes it streamed, and once each hint has had [`TRIAL_REGIONS`]
//! regions the one with the shorter time per byte is kept for the life of the process.
//! Taking turns region by region, the two see the same mix of matrices and the same drift
//! in machine load. A hint never changes a result, only how early lines arrive.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use super::tile::Prefetch;

/// The environment variable that fixes the hint (`nta` or `l2`) instead of measuring.
pub const PREFETCH_ENV: &str = "SPECD_CPU_PREFETCH";

/// Regions each hint is timed on before the choice.
const TRIAL_REGIONS: usize = 192;

/// The hints tried, in turn.
const CANDIDATES: [Prefetch; 2] = [Prefetch::Once, Prefetch::OnceL2];

const UNDECIDED: u8 = u8::MAX;

/// The process's choice of hint for single-pass regions.
pub(crate) struct Streaming {
    /// The index of the chosen candidate, or [`UNDECIDED`] during the trial.
    chosen: AtomicU8,
    trial: Mutex<Trial>,
}

/// A region run during the trial, to be reported with [`Streaming::report`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ticket(usize);

#[derive(Default)]
struct Trial {
    next: usize,
    nanos: [u128; CANDIDATES.len()],
    bytes: [u128; CANDIDATES.len()],
    regions: [usize; CANDIDATES.len()],
}

impl Trial {
    /// The candidate for the next region: each in turn.
    fn take_turn(&mut self) -> usize {
        let c = self.next % CANDIDATES.len();
        self.next += 1;
        c
    }

    /// Adds a timed region; once every candidate has had its regions, the winner.
    fn record(&mut self, candidate: usize, nanos: u128, bytes: u128) -> Option<usize> {
        self.nanos[candidate] += nanos;
        self.bytes[candidate] += bytes;
        self.regions[candidate] += 1;
        self.regions
            .iter()
            .all(|&r| r >= TRIAL_REGIONS)
            .then(|| self.fastest())
    }

    /// The candidate with the shortest time per byte (the first among equals).
    fn fastest(&self) -> usize {
        let per_byte = |c: usize| self.nanos[c] as f64 / self.bytes[c].max(1) as f64;
        (1..CANDIDATES.len()).fold(0, |best, c| {
            if per_byte(c) < per_byte(best) {
                c
            } else {
                best
            }
        })
    }

    /// Bytes per second of each candidate so far.
    fn rates(&self) -> [f64; CANDIDATES.len()] {
        std::array::from_fn(|c| self.bytes[c] as f64 / (self.nanos[c].max(1) as f64 * 1e-9))
    }
}

fn name(prefetch: Prefetch) -> &'static str {
    match prefetch {
        Prefetch::Once => "nta",
        Prefetch::OnceL2 => "l2",
        Prefetch::Reuse => "reuse",
    }
}

/// The candidate an environment value names; `None` for `auto`, with a warning for
/// anything unknown.
fn named(value: &str) -> Option<usize> {
    let value = value.trim();
    if value == "auto" {
        return None;
    }
    let found = CANDIDATES.iter().position(|&c| name(c) == value);
    if found.is_none() {
        tracing::warn!(
            variable = PREFETCH_ENV,
            value,
            "unknown prefetch hint (nta, l2 or auto); measuring"
        );
    }
    found
}

impl Streaming {
    fn new(fixed: Option<usize>) -> Self {
        Self {
            chosen: AtomicU8::new(fixed.map_or(UNDECIDED, |c| c as u8)),
            trial: Mutex::new(Trial::default()),
        }
    }

    /// The process-wide choice: fixed by `SPECD_CPU_PREFETCH`, or measured.
    pub(crate) fn global() -> &'static Streaming {
        static STREAMING: OnceLock<Streaming> = OnceLock::new();
        STREAMING.get_or_init(|| {
            Self::new(
                std::env::var(PREFETCH_ENV)
                    .ok()
                    .and_then(|value| named(&value)),
            )
        })
    }

    /// The hint of the next single-pass region and, while the trial runs, the ticket to
    /// report its time with.
    pub(crate) fn next(&self) -> (Prefetch, Option<Ticket>) {
        let chosen = self.chosen.load(Ordering::Relaxed);
        if chosen != UNDECIDED {
            return (CANDIDATES[chosen as usize], None);
        }
        let c = self.trial().take_turn();
        (CANDIDATES[c], Some(Ticket(c)))
    }

    /// Reports how long a trial region took to stream `bytes` of weights.
    pub(crate) fn report(&self, ticket: Ticket, elapsed: Duration, bytes: usize) {
        let mut trial = self.trial();
        if self.chosen.load(Ordering::Relaxed) != UNDECIDED {
            return;
        }
        if let Some(winner) = trial.record(ticket.0, elapsed.as_nanos(), bytes as u128) {
            let rates = trial.rates();
            tracing::info!(
                hint = name(CANDIDATES[winner]),
                nta_gbs = rates[0] / 1e9,
                l2_gbs = rates[1] / 1e9,
                "prefetch hint for single-pass matmuls, measured"
            );
            self.chosen.store(winner as u8, Ordering::Relaxed);
        }
    }

    /// The hint in use, or `None` while it is being measured.
    pub(crate) fn chosen(&self) -> Option<&'static str> {
        let chosen = self.chosen.load(Ordering::Relaxed);
        (chosen != UNDECIDED).then(|| name(CANDIDATES[chosen as usize]))
    }

    fn trial(&self) -> std::sync::MutexGuard<'_, Trial> {
        self.trial.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The prefetch hint single-pass matmuls use in this process: `nta`, `l2`, or `None` while
/// the first regions are still measuring which.
pub fn prefetch_hint() -> Option<&'static str> {
    Streaming::global().chosen()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a trial where candidate `c` streams at `rates[c]` bytes per nanosecond.
    fn run_trial(streaming: &Streaming, rates: [u128; 2]) -> usize {
        let mut regions = 0;
        loop {
            let (hint, ticket) = streaming.next();
            let Some(ticket) = ticket else {
                return regions;
            };
            assert_eq!(hint, CANDIDATES[ticket.0]);
            let bytes = 10_000 + 37 * regions;
            let nanos = bytes as u128 / rates[ticket.0];
            streaming.report(ticket, Duration::from_nanos(nanos as u64), bytes);
            regions += 1;
        }
    }

    #[test]
    fn the_trial_keeps_the_hint_with_the_shorter_time_per_byte() {
        for (rates, winner) in [([2, 3], Prefetch::OnceL2), ([5, 3], Prefetch::Once)] {
            let streaming = Streaming::new(None);
            assert_eq!(streaming.chosen(), None);
            let regions = run_trial(&streaming, rates);
            // The hints took turns, each for its share of regions.
            assert_eq!(regions, TRIAL_REGIONS * CANDIDATES.len());
            for _ in 0..5 {
                assert!(matches!(streaming.next(), (hint, None) if hint == winner));
            }
            assert_eq!(streaming.chosen(), Some(name(winner)));
        }
    }

    #[test]
    fn a_named_hint_skips_the_trial() {
        for (value, hint) in [("nta", Prefetch::Once), (" l2 ", Prefetch::OnceL2)] {
            let streaming = Streaming::new(named(value));
            assert!(matches!(streaming.next(), (h, None) if h == hint));
        }
        assert_eq!(named("auto"), None);
        assert_eq!(named("t0"), None);
    }

    #[test]
    fn reports_after_the_choice_change_nothing() {
        let streaming = Streaming::new(None);
        let (_, ticket) = streaming.next();
        run_trial(&streaming, [1, 4]);
        let ticket = ticket.expect("a trial ticket");
        // A late report of a region started during the trial, 1000x faster than either.
        streaming.report(ticket, Duration::from_nanos(1), 1 << 30);
        assert_eq!(streaming.chosen(), Some("l2"));
    }
}
