//! What one benchmark mode measured, and the table and JSON that show all modes side by side.

use std::time::Duration;

use serde_json::{json, Value};

use super::timing::RoundTiming;

/// One generation's outcome.
#[derive(Debug, Clone, Default)]
pub struct RunSample {
    pub tokens: usize,
    pub elapsed: Duration,
    pub rounds: u64,
    pub accepted: u64,
    /// The generated ids (embedded modes only; the split modes leave it empty).
    pub output: Vec<u32>,
    /// Draft tokens verified.
    pub drafted: u64,
    /// Per draft position: rounds that drafted there, and rounds that accepted there.
    pub drafted_at_position: Vec<u64>,
    pub accepted_at_position: Vec<u64>,
}

/// Everything measured for one mode over all prompts and runs.
#[derive(Debug, Clone, Default)]
pub struct ModeResult {
    pub name: String,
    pub runs: Vec<RunSample>,
    /// Per-round phases, where the round loop ran in this process with timed wrappers.
    pub phases: Vec<RoundTiming>,
    /// Per-round end-to-end latency seen by a client (time between streamed chunks), where
    /// the phases are not visible.
    pub client_rounds: Vec<Duration>,
}

impl ModeResult {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ..Self::default()
        }
    }

    pub fn tokens_per_second(&self) -> f64 {
        let tokens: usize = self.runs.iter().map(|r| r.tokens).sum();
        let secs: f64 = self.runs.iter().map(|r| r.elapsed.as_secs_f64()).sum();
        if secs > 0.0 {
            tokens as f64 / secs
        } else {
            0.0
        }
    }

    /// Tokens emitted per verify round (accepted drafts plus the target's own token).
    pub fn tokens_per_round(&self) -> f64 {
        let rounds: u64 = self.runs.iter().map(|r| r.rounds).sum();
        let accepted: u64 = self.runs.iter().map(|r| r.accepted).sum();
        if rounds > 0 {
            (accepted + rounds) as f64 / rounds as f64
        } else {
            0.0
        }
    }
}

/// The `q`-quantile (nearest rank) in milliseconds.
fn quantile_ms(values: &[Duration], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted: Vec<Duration> = values.to_vec();
    sorted.sort();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1].as_secs_f64() * 1e3)
}

/// p50 and p99 of one latency series.
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

impl Spread {
    pub fn of(values: &[Duration]) -> Self {
        Self {
            p50: quantile_ms(values, 0.5),
            p99: quantile_ms(values, 0.99),
        }
    }

    fn cell(&self) -> String {
        match (self.p50, self.p99) {
            (Some(a), Some(b)) => format!("{a:.2}/{b:.2}"),
            _ => "-".into(),
        }
    }

    fn json(&self) -> Value {
        json!({ "p50_ms": self.p50, "p99_ms": self.p99 })
    }
}

struct PhaseSpreads {
    round: Spread,
    draft: Spread,
    verify: Spread,
    overhead: Spread,
}

fn phase_spreads(phases: &[RoundTiming]) -> PhaseSpreads {
    let pick = |f: &dyn Fn(&RoundTiming) -> Duration| -> Spread {
        Spread::of(&phases.iter().map(f).collect::<Vec<_>>())
    };
    PhaseSpreads {
        round: pick(&|t| t.round),
        draft: pick(&|t| t.draft),
        verify: pick(&|t| t.verify),
        overhead: pick(&|t| t.overhead()),
    }
}

/// The comparison table: ratios are to the first mode (plain, embedded).
pub fn table(modes: &[ModeResult]) -> String {
    let base = modes.first().map_or(0.0, ModeResult::tokens_per_second);
    let mut out = format!(
        "{:<22} {:>9} {:>7} {:>10} {:>15} {:>15} {:>15} {:>15} {:>17}\n",
        "mode",
        "tok/s",
        "ratio",
        "tok/round",
        "round p50/p99",
        "draft p50/p99",
        "verify p50/p99",
        "other p50/p99",
        "client p50/p99"
    );
    for mode in modes {
        let tps = mode.tokens_per_second();
        let ratio = if base > 0.0 { tps / base } else { 0.0 };
        let spreads = phase_spreads(&mode.phases);
        out.push_str(&format!(
            "{:<22} {:>9.2} {:>6.2}x {:>10.2} {:>15} {:>15} {:>15} {:>15} {:>17}\n",
            mode.name,
            tps,
            ratio,
            mode.tokens_per_round(),
            spreads.round.cell(),
            spreads.draft.cell(),
            spreads.verify.cell(),
            spreads.overhead.cell(),
            Spread::of(&mode.client_rounds).cell(),
        ));
    }
    out
}

pub fn mode_json(mode: &ModeResult, base_tps: f64) -> Value {
    let tps = mode.tokens_per_second();
    let spreads = phase_spreads(&mode.phases);
    json!({
        "mode": mode.name,
        "generations": mode.runs.len(),
        "tokens": mode.runs.iter().map(|r| r.tokens).sum::<usize>(),
        "seconds": mode.runs.iter().map(|r| r.elapsed.as_secs_f64()).sum::<f64>(),
        "tokens_per_second": tps,
        "ratio_to_plain": if base_tps > 0.0 { tps / base_tps } else { 0.0 },
        "mean_accepted_tokens_per_round": mode.tokens_per_round(),
        "rounds_timed": mode.phases.len(),
        "round": spreads.round.json(),
        "draft": spreads.draft.json(),
        "verify": spreads.verify.json(),
        "router_overhead": spreads.overhead.json(),
        "client_round": Spread::of(&mode.client_rounds).json(),
    })
}
