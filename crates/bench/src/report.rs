//! What one benchmark mode measured, and the table and JSON that show all modes side by side.

use std::ops::Range;
use std::time::Duration;

use serde_json::{json, Value};

use super::prompts::{self, Prompt};
use super::quantile::{ms, quantile};
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
    /// Per generation, where the caller recorded it ([`ModeResult::close_run`]): the range of
    /// `phases` its rounds fill, so that a subset of the generations keeps its own rounds.
    pub run_phases: Vec<Range<usize>>,
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

    /// Records that the generation just pushed to `runs` filled the phases from
    /// `phases_before` on.
    pub fn close_run(&mut self, phases_before: usize) {
        self.run_phases
            .push(phases_before.min(self.phases.len())..self.phases.len());
    }

    /// The generations whose index `keep` accepts, with their rounds when every generation
    /// recorded its range (otherwise without phases); client round latencies are not kept,
    /// as they cannot be told apart by generation.
    pub fn subset(&self, keep: impl Fn(usize) -> bool) -> ModeResult {
        let tracked = self.run_phases.len() == self.runs.len();
        let mut out = ModeResult::new(&self.name);
        for (i, run) in self.runs.iter().enumerate() {
            if !keep(i) {
                continue;
            }
            out.runs.push(run.clone());
            if tracked {
                let before = out.phases.len();
                let range = self.run_phases[i].clone();
                out.phases
                    .extend_from_slice(self.phases.get(range).unwrap_or_default());
                out.close_run(before);
            }
        }
        out
    }

    /// The generations of the prompts `keep` accepts (by index among `prompts` prompts).
    /// Every mode appends one generation per prompt, prompt after prompt, run after run, so
    /// generation i ran prompt i % prompts.
    pub fn of_prompts(&self, prompts: usize, keep: impl Fn(usize) -> bool) -> ModeResult {
        self.subset(|i| keep(i % prompts.max(1)))
    }

    /// The generations of the prompts of one kind.
    pub fn of_kind(&self, prompts: &[Prompt], kind: &str) -> ModeResult {
        self.of_prompts(prompts.len(), |p| {
            prompts.get(p).is_some_and(|prompt| prompt.kind == kind)
        })
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

/// p50 and p99 of one latency series.
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

impl Spread {
    pub fn of(values: &[Duration]) -> Self {
        Self {
            p50: quantile(values, 0.5).map(ms),
            p99: quantile(values, 0.99).map(ms),
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

fn ratio(tps: f64, base: f64) -> f64 {
    if base > 0.0 {
        tps / base
    } else {
        0.0
    }
}

/// Tokens/s per prompt kind and over all prompts, each with its ratio to the first mode
/// (plain, embedded) on the same prompts. Empty when the prompts are of a single kind: the
/// main table says it all then.
pub fn kinds_table(modes: &[ModeResult], prompts: &[Prompt]) -> String {
    let kinds = prompts::kinds(prompts);
    let Some(base) = modes.first() else {
        return String::new();
    };
    if kinds.len() < 2 {
        return String::new();
    }
    let mut out =
        String::from("tok/s by prompt kind (ratio to plain (embedded) on the same prompts)\n");
    out.push_str(&format!("{:<22}", "mode"));
    for kind in kinds.iter().map(String::as_str).chain(["all"]) {
        out.push_str(&format!(" {kind:>16}"));
    }
    out.push('\n');
    for mode in modes {
        out.push_str(&format!("{:<22}", mode.name));
        for kind in &kinds {
            let tps = mode.of_kind(prompts, kind).tokens_per_second();
            let base = base.of_kind(prompts, kind).tokens_per_second();
            out.push_str(&format!(" {tps:>9.2} {:>5.2}x", ratio(tps, base)));
        }
        let tps = mode.tokens_per_second();
        out.push_str(&format!(
            " {tps:>9.2} {:>5.2}x\n",
            ratio(tps, base.tokens_per_second())
        ));
    }
    out
}

/// Per prompt kind: the prompts of that kind and each mode's tokens/s and ratio to the
/// first mode on them.
pub fn kinds_json(modes: &[ModeResult], prompts: &[Prompt]) -> Value {
    let Some(base) = modes.first() else {
        return json!([]);
    };
    let kinds: Vec<Value> = prompts::kinds(prompts)
        .iter()
        .map(|kind| {
            let base_tps = base.of_kind(prompts, kind).tokens_per_second();
            let members: Vec<usize> = (0..prompts.len())
                .filter(|&i| prompts[i].kind == *kind)
                .collect();
            json!({
                "kind": kind,
                "prompts": members,
                "modes": modes.iter().map(|m| {
                    let tps = m.of_kind(prompts, kind).tokens_per_second();
                    json!({
                        "mode": m.name,
                        "tokens_per_second": tps,
                        "ratio_to_plain": ratio(tps, base_tps),
                    })
                }).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!(kinds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(ms: u64) -> RoundTiming {
        RoundTiming {
            draft: Duration::ZERO,
            verify: Duration::from_millis(ms),
            round: Duration::from_millis(ms),
            width: 1,
        }
    }

    fn prompt(kind: &str) -> Prompt {
        Prompt {
            kind: kind.into(),
            label: kind.into(),
            ids: vec![1],
        }
    }

    /// Two runs of two prompts, recorded as the sweep records them.
    fn mode() -> ModeResult {
        let mut mode = ModeResult::new("m");
        for (tokens, rounds) in [(4, 1), (8, 2), (5, 3), (9, 4)] {
            let before = mode.phases.len();
            mode.runs.push(RunSample {
                tokens,
                elapsed: Duration::from_secs(1),
                ..RunSample::default()
            });
            mode.phases.extend((0..rounds).map(|_| timing(10)));
            mode.close_run(before);
        }
        mode
    }

    #[test]
    fn subsets_keep_their_own_rounds() {
        let prompts = [prompt("code"), prompt("edit")];
        let edit = mode().of_kind(&prompts, "edit");
        assert_eq!(
            edit.runs.iter().map(|r| r.tokens).collect::<Vec<_>>(),
            [8, 9]
        );
        // Generations 1 and 3 had 2 and 4 rounds.
        assert_eq!(edit.phases.len(), 6);
        assert_eq!(edit.run_phases, [0..2, 2..6]);
        assert!((edit.tokens_per_second() - 8.5).abs() < 1e-9);
    }

    #[test]
    fn kinds_table_only_for_several_kinds() {
        let one = [prompt("code"), prompt("code")];
        assert!(kinds_table(&[mode()], &one).is_empty());
        let two = [prompt("code"), prompt("edit")];
        let table = kinds_table(&[mode()], &two);
        assert!(table.contains("code") && table.contains("edit") && table.contains("all"));
        let json = kinds_json(&[mode()], &two);
        assert_eq!(json[1]["kind"], "edit");
        assert_eq!(json[1]["prompts"], json!([1]));
        assert_eq!(json[1]["modes"][0]["ratio_to_plain"], 1.0);
    }
}
