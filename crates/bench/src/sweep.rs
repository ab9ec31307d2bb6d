//! The draft-count sweep: plain decoding and, per drafter, fixed K = 1..n drafts per round
//! (block size K + 1), every speculative output checked against the plain one, with the
//! acceptance per draft position, the measured step costs and the speed-up they predict.

use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Value};
use specd_core::{BlockSizeConfig, Detokenizer};
use specd_verifier::TargetModel;

use super::costs::StepCosts;
use super::embedded::EmbeddedSuite;
use super::prompts::{self, Prompt};
use super::quantile::{ms, quantile};
use super::report::ModeResult;

/// Tokens of the unmeasured warm-up generation of each drafter.
const WARMUP_TOKENS: usize = 8;

/// A drafter of the sweep and the suite that runs it.
pub struct SweepDrafter<T: TargetModel> {
    pub name: &'static str,
    pub suite: EmbeddedSuite<T>,
}

/// One row: a drafter at a fixed draft count (or the adaptive, cost-aware policy) over every
/// prompt and run.
pub struct SweepRow {
    pub drafter: &'static str,
    /// K, the drafts per round; `None` for the adaptive row.
    pub drafts: Option<usize>,
    pub block: BlockSizeConfig,
    pub mode: ModeResult,
    /// Generations whose ids equal the plain generation's.
    pub identical: usize,
}

pub struct SweepResult {
    pub plain: ModeResult,
    pub rows: Vec<SweepRow>,
    /// The plain output of each prompt (the first run's).
    pub plain_outputs: Vec<Vec<u32>>,
    pub mismatches: Vec<String>,
}

/// Runs the sweep: per run and prompt, plain first, then every drafter at every count, then
/// (with `adaptive`) every drafter under the adaptive, cost-aware block-size policy.
pub async fn run<T: TargetModel>(
    drafters: &[SweepDrafter<T>],
    prompts: &[Prompt],
    counts: &[usize],
    adaptive: Option<BlockSizeConfig>,
    max_tokens: usize,
    runs: u64,
    eos: &[u32],
) -> Result<SweepResult> {
    let Some(first) = drafters.first() else {
        anyhow::bail!("sweep: no drafter to sweep");
    };
    // One short unmeasured generation per drafter first: page faults on memory-mapped
    // weights and allocator growth land there.
    let mut discard = ModeResult::new("warm-up");
    let warm = max_tokens.min(WARMUP_TOKENS);
    first
        .suite
        .run_with(
            &prompts[0].ids,
            warm,
            BlockSizeConfig::PLAIN,
            eos,
            &mut discard,
        )
        .await?;
    for d in drafters {
        let block = BlockSizeConfig::fixed(counts.first().copied().unwrap_or(1) + 1);
        d.suite
            .run_with(&prompts[0].ids, warm, block, eos, &mut discard)
            .await?;
    }
    let mut result = SweepResult {
        plain: ModeResult::new("plain"),
        rows: drafters
            .iter()
            .flat_map(|d| {
                let fixed = counts.iter().map(|&k| SweepRow {
                    drafter: d.name,
                    drafts: Some(k),
                    block: BlockSizeConfig::fixed(k + 1),
                    mode: ModeResult::new(&format!("{} K={k}", d.name)),
                    identical: 0,
                });
                let auto = adaptive.map(|block| SweepRow {
                    drafter: d.name,
                    drafts: None,
                    block,
                    mode: ModeResult::new(&format!("{} auto", d.name)),
                    identical: 0,
                });
                fixed.chain(auto)
            })
            .collect(),
        plain_outputs: Vec::new(),
        mismatches: Vec::new(),
    };
    for run in 0..runs {
        for prompt in prompts {
            // Every generation records its own rounds, for the per-kind and per-prompt figures.
            let before = result.plain.phases.len();
            first
                .suite
                .run_with(
                    &prompt.ids,
                    max_tokens,
                    BlockSizeConfig::PLAIN,
                    eos,
                    &mut result.plain,
                )
                .await?;
            result.plain.close_run(before);
            let plain = result
                .plain
                .runs
                .last()
                .map(|r| r.output.clone())
                .unwrap_or_default();
            if run == 0 {
                result.plain_outputs.push(plain.clone());
            }
            for row in result.rows.iter_mut() {
                let Some(d) = drafters.iter().find(|d| d.name == row.drafter) else {
                    continue;
                };
                let before = row.mode.phases.len();
                d.suite
                    .run_with(&prompt.ids, max_tokens, row.block, eos, &mut row.mode)
                    .await?;
                row.mode.close_run(before);
                let spec = row.mode.runs.last().map(|r| &r.output);
                if spec == Some(&plain) {
                    row.identical += 1;
                } else {
                    let at = spec.map_or(0, |s| {
                        s.iter().zip(&plain).take_while(|(a, b)| a == b).count()
                    });
                    let message = format!(
                        "MISMATCH: {} on prompt {:?}: speculative output differs from plain \
                         at token {at}",
                        row.mode.name, prompt.label
                    );
                    eprintln!("{message}");
                    result.mismatches.push(message);
                }
            }
        }
    }
    Ok(result)
}

/// Speculative measurements of one row, in the units of the speed-up model.
struct RowModel {
    /// Accepted drafts over drafted ones.
    alpha: f64,
    /// Per draft position: accepted / drafted there.
    per_position: Vec<f64>,
    tokens_per_round: f64,
    /// Mean cost of a round in target decode steps, from the measured step costs and the
    /// actual width of every round: drafts x draft step + verify(width).
    round_cost: f64,
    /// (1 - a^(K+1)) / (1 - a) tokens per round over K c_draft + c_verify(K + 1).
    geometric: f64,
    /// The measured tokens per round (the per-position product form) over `round_cost`.
    positional: f64,
}

/// The model of `mode`'s generations (a row's, or a subset of them), run with `drafts` drafts
/// per round (`None`: the adaptive policy).
fn row_model(
    mode: &ModeResult,
    drafts: Option<usize>,
    costs: &StepCosts,
    draft_cost: f64,
) -> RowModel {
    let runs = &mode.runs;
    let drafted: u64 = runs.iter().map(|r| r.drafted).sum();
    let accepted: u64 = runs.iter().map(|r| r.accepted).sum();
    let alpha = if drafted > 0 {
        accepted as f64 / drafted as f64
    } else {
        0.0
    };
    let positions = runs
        .iter()
        .map(|r| r.drafted_at_position.len())
        .max()
        .unwrap_or(0);
    let per_position = (0..positions)
        .map(|i| {
            let at = |v: &Vec<u64>| v.get(i).copied().unwrap_or(0);
            let d: u64 = runs.iter().map(|r| at(&r.drafted_at_position)).sum();
            let a: u64 = runs.iter().map(|r| at(&r.accepted_at_position)).sum();
            if d > 0 {
                a as f64 / d as f64
            } else {
                0.0
            }
        })
        .collect();
    let phases = &mode.phases;
    let round_cost = if phases.is_empty() {
        0.0
    } else {
        phases
            .iter()
            .map(|p| {
                let drafts = p.width.saturating_sub(1) as f64;
                drafts * draft_cost + costs.verify_cost(p.width).unwrap_or(f64::NAN)
            })
            .sum::<f64>()
            / phases.len() as f64
    };
    // The geometric form needs one K; the adaptive row has none.
    let geometric = drafts.map_or(f64::NAN, |k| {
        let expected = if (1.0 - alpha).abs() < 1e-9 {
            (k + 1) as f64
        } else {
            (1.0 - alpha.powi(k as i32 + 1)) / (1.0 - alpha)
        };
        expected / (k as f64 * draft_cost + costs.verify_cost(k + 1).unwrap_or(f64::NAN))
    });
    let tokens_per_round = mode.tokens_per_round();
    RowModel {
        alpha,
        per_position,
        tokens_per_round,
        round_cost,
        geometric,
        positional: tokens_per_round / round_cost,
    }
}

/// Tokens per second over the decode rounds only (prefill and drafter open excluded), the
/// figure llama.cpp's tools print.
pub fn decode_tokens_per_second(mode: &ModeResult) -> f64 {
    let (tokens, secs) = decode_totals(mode);
    if secs > 0.0 {
        tokens as f64 / secs
    } else {
        0.0
    }
}

/// Tokens and seconds of the decode rounds: every token but the first, which the prefill
/// emits, over the time of every verify round.
fn decode_totals(mode: &ModeResult) -> (usize, f64) {
    let tokens: usize = mode.runs.iter().map(|r| r.tokens.saturating_sub(1)).sum();
    let secs: f64 = mode.phases.iter().map(|p| p.round.as_secs_f64()).sum();
    (tokens, secs)
}

fn p50_ms(values: impl Iterator<Item = Duration>) -> f64 {
    let samples: Vec<Duration> = values.collect();
    quantile(&samples, 0.5).map_or(0.0, ms)
}

fn positions_cell(rates: &[f64]) -> String {
    rates
        .iter()
        .map(|r| format!("{:.2}", r))
        .collect::<Vec<_>>()
        .join(" ")
}

fn draft_cost_of(draft_costs: &[(&str, f64)], drafter: &str) -> f64 {
    draft_costs
        .iter()
        .find(|(n, _)| *n == drafter)
        .map_or(0.0, |(_, c)| *c)
}

fn ratio_of(tps: f64, base: f64) -> f64 {
    if base > 0.0 {
        tps / base
    } else {
        0.0
    }
}

/// Generations of `spec` whose ids equal those of the plain generation of the same prompt
/// and run, among the generations `keep` selects.
fn identical_where(spec: &ModeResult, plain: &ModeResult, keep: impl Fn(usize) -> bool) -> usize {
    spec.runs
        .iter()
        .zip(&plain.runs)
        .enumerate()
        .filter(|(i, (s, p))| keep(*i) && s.output == p.output)
        .count()
}

/// Decode tokens/s of every row and of plain per prompt kind, with the ratio to plain on the
/// prompts of that kind, and over all prompts. Empty for a single kind, which the main
/// table already shows.
pub fn kinds_table(result: &SweepResult, prompts: &[Prompt]) -> String {
    let kinds = prompts::kinds(prompts);
    if kinds.len() < 2 {
        return String::new();
    }
    let plain: Vec<f64> = kinds
        .iter()
        .map(|kind| decode_tokens_per_second(&result.plain.of_kind(prompts, kind)))
        .collect();
    let plain_all = decode_tokens_per_second(&result.plain);
    let mut out = String::from(
        "spec/plain by prompt kind (decode tok/s, ratio to plain on the same prompts)\n",
    );
    out.push_str(&format!("{:<12} {:>4}", "drafter", "K"));
    for kind in kinds.iter().map(String::as_str).chain(["all"]) {
        out.push_str(&format!(" {kind:>14}"));
    }
    out.push('\n');
    out.push_str(&format!("{:<12} {:>4}", "plain", 0));
    for tps in plain.iter().chain([&plain_all]) {
        out.push_str(&format!(" {tps:>7.2} {:>5.2}x", 1.0));
    }
    out.push('\n');
    for row in &result.rows {
        out.push_str(&format!(
            "{:<12} {:>4}",
            row.drafter,
            row.drafts.map_or("auto".to_owned(), |k| k.to_string())
        ));
        for (kind, base) in kinds.iter().zip(&plain) {
            let tps = decode_tokens_per_second(&row.mode.of_kind(prompts, kind));
            out.push_str(&format!(" {tps:>7.2} {:>5.2}x", ratio_of(tps, *base)));
        }
        let tps = decode_tokens_per_second(&row.mode);
        out.push_str(&format!(" {tps:>7.2} {:>5.2}x\n", ratio_of(tps, plain_all)));
    }
    out
}

/// The sweep table (decode-only tokens/s; ratios are to plain).
pub fn table(result: &SweepResult, costs: &StepCosts, draft_costs: &[(&str, f64)]) -> String {
    let plain = decode_tokens_per_second(&result.plain);
    let runs = result.plain.runs.len();
    let mut out = format!(
        "{:<12} {:>4} {:>7} {:>6} {:>5} {:>6} {:>8} {:>8} {:>6} {:>6} {:>6} {:>9} {:>5}  {}\n",
        "drafter",
        "K",
        "tok/s",
        "ratio",
        "alpha",
        "tok/rd",
        "draft ms",
        "verif ms",
        "cost",
        "geo",
        "pos",
        "meas/pos",
        "same",
        "acceptance per draft position"
    );
    out.push_str(&format!(
        "{:<12} {:>4} {:>7.2} {:>5.2}x {:>5} {:>6.2} {:>8} {:>8.1} {:>6.2} {:>6} {:>6} {:>9} {:>5}\n",
        "plain",
        0,
        plain,
        1.0,
        "-",
        1.0,
        "-",
        p50_ms(result.plain.phases.iter().map(|p| p.verify)),
        1.0,
        "-",
        "-",
        "-",
        format!("{runs}/{runs}")
    ));
    for row in &result.rows {
        let draft_cost = draft_cost_of(draft_costs, row.drafter);
        let m = row_model(&row.mode, row.drafts, costs, draft_cost);
        let tps = decode_tokens_per_second(&row.mode);
        let ratio = if plain > 0.0 { tps / plain } else { 0.0 };
        out.push_str(&format!(
            "{:<12} {:>4} {:>7.2} {:>5.2}x {:>5.2} {:>6.2} {:>8.1} {:>8.1} {:>6.2} {:>5.2}x {:>5.2}x {:>9.2} {:>5}  {}\n",
            row.drafter,
            row.drafts.map_or("auto".to_owned(), |k| k.to_string()),
            tps,
            ratio,
            m.alpha,
            m.tokens_per_round,
            p50_ms(row.mode.phases.iter().map(|p| p.draft)),
            p50_ms(row.mode.phases.iter().map(|p| p.verify)),
            m.round_cost,
            m.geometric,
            m.positional,
            ratio / m.positional,
            format!("{}/{}", row.identical, row.mode.runs.len()),
            positions_cell(&m.per_position),
        ));
    }
    out
}

pub fn json(
    result: &SweepResult,
    costs: &StepCosts,
    draft_costs: &[(&str, f64)],
    prompts: &[Prompt],
    prompt_texts: &[String],
    detokenizer: &dyn Detokenizer,
) -> Value {
    let plain = decode_tokens_per_second(&result.plain);
    let kinds = prompts::kinds(prompts);
    let n_prompts = prompts.len();
    let plain_per_prompt: Vec<ModeResult> = (0..n_prompts)
        .map(|p| result.plain.of_prompts(n_prompts, |q| q == p))
        .collect();
    let rows: Vec<Value> = result
        .rows
        .iter()
        .map(|row| {
            let draft_cost = draft_cost_of(draft_costs, row.drafter);
            let m = row_model(&row.mode, row.drafts, costs, draft_cost);
            let tps = decode_tokens_per_second(&row.mode);
            let ratio = if plain > 0.0 { tps / plain } else { 0.0 };
            let n = prompts.len();
            let per_kind: Vec<Value> = kinds
                .iter()
                .map(|kind| {
                    let mode = row.mode.of_kind(prompts, kind);
                    let m = row_model(&mode, row.drafts, costs, draft_cost);
                    let tps = decode_tokens_per_second(&mode);
                    let base = decode_tokens_per_second(&result.plain.of_kind(prompts, kind));
                    let of_kind = |i: usize| prompts[i % n].kind == *kind;
                    json!({
                        "kind": kind,
                        "decode_tokens_per_second": tps,
                        "plain_decode_tokens_per_second": base,
                        "ratio_to_plain": ratio_of(tps, base),
                        "alpha": m.alpha,
                        "tokens_per_round": m.tokens_per_round,
                        "identical": identical_where(&row.mode, &result.plain, of_kind),
                        "generations": mode.runs.len(),
                    })
                })
                .collect();
            let per_prompt: Vec<Value> = (0..n)
                .map(|p| {
                    let mode = row.mode.of_prompts(n, |q| q == p);
                    let m = row_model(&mode, row.drafts, costs, draft_cost);
                    let tps = decode_tokens_per_second(&mode);
                    let (tokens, seconds) = decode_totals(&mode);
                    let base = decode_tokens_per_second(&plain_per_prompt[p]);
                    // Counts as well as rates, so that a driver can sum any set of prompts.
                    json!({
                        "prompt": p,
                        "kind": prompts[p].kind,
                        "decode_tokens": tokens,
                        "decode_seconds": seconds,
                        "decode_tokens_per_second": tps,
                        "ratio_to_plain": ratio_of(tps, base),
                        "drafted": mode.runs.iter().map(|r| r.drafted).sum::<u64>(),
                        "accepted": mode.runs.iter().map(|r| r.accepted).sum::<u64>(),
                        "alpha": m.alpha,
                        "tokens_per_round": m.tokens_per_round,
                    })
                })
                .collect();
            json!({
                "drafter": row.drafter,
                "k": row.drafts,
                "decode_tokens_per_second": tps,
                "ratio_to_plain": ratio,
                "alpha": m.alpha,
                "acceptance_per_position": m.per_position,
                "tokens_per_round": m.tokens_per_round,
                "draft_ms_p50": p50_ms(row.mode.phases.iter().map(|p| p.draft)),
                "verify_ms_p50": p50_ms(row.mode.phases.iter().map(|p| p.verify)),
                "round_cost_steps": m.round_cost,
                "theory_geometric": m.geometric,
                "theory_positional": m.positional,
                "measured_over_theory": ratio / m.positional,
                "identical": row.identical,
                "generations": row.mode.runs.len(),
                "per_kind": per_kind,
                "per_prompt": per_prompt,
            })
        })
        .collect();
    let kinds_json: Vec<Value> = kinds
        .iter()
        .map(|kind| {
            json!({
                "kind": kind,
                "prompts": (0..n_prompts).filter(|&i| prompts[i].kind == *kind).collect::<Vec<_>>(),
                "plain_decode_tokens_per_second":
                    decode_tokens_per_second(&result.plain.of_kind(prompts, kind)),
            })
        })
        .collect();
    let prompts: Vec<Value> = prompts
        .iter()
        .zip(prompt_texts)
        .zip(&result.plain_outputs)
        .zip(&plain_per_prompt)
        .map(|(((p, text), output), plain)| {
            let (tokens, seconds) = decode_totals(plain);
            json!({
                "kind": p.kind,
                "plain_decode_tokens": tokens,
                "plain_decode_seconds": seconds,
                "plain_decode_tokens_per_second": decode_tokens_per_second(plain),
                "label": p.label,
                "text": text,
                "ids": p.ids,
                "prompt_tokens": p.ids.len(),
                "plain_output": output,
                "plain_text": detokenizer.decode(output).unwrap_or_default(),
            })
        })
        .collect();
    json!({
        "plain_decode_tokens_per_second": plain,
        "plain_verify_ms_p50": p50_ms(result.plain.phases.iter().map(|p| p.verify)),
        "rows": rows,
        "kinds": kinds_json,
        "costs": costs.json(),
        "prompts": prompts,
        "mismatches": result.mismatches,
    })
}

#[cfg(test)]
mod tests {
    use super::super::report::RunSample;
    use super::super::timing::RoundTiming;
    use super::*;

    /// One generation per prompt of `tokens` tokens, each round `ms` long, one round a
    /// token after the first.
    fn mode(name: &str, runs: &[(usize, u64)]) -> ModeResult {
        let mut mode = ModeResult::new(name);
        for &(tokens, ms) in runs {
            let before = mode.phases.len();
            mode.runs.push(RunSample {
                tokens,
                output: vec![7; tokens],
                ..RunSample::default()
            });
            mode.phases.extend((1..tokens).map(|_| RoundTiming {
                draft: Duration::ZERO,
                verify: Duration::from_millis(ms),
                round: Duration::from_millis(ms),
                width: 1,
            }));
            mode.close_run(before);
        }
        mode
    }

    fn prompt(kind: &str) -> Prompt {
        Prompt {
            kind: kind.into(),
            label: kind.into(),
            ids: vec![1],
        }
    }

    #[test]
    fn kinds_table_gives_each_kind_its_own_plain() {
        let prompts = [prompt("prose"), prompt("edit")];
        // Plain: 100 ms a token on both prompts; the row: as slow on prose, twice as fast
        // on the edit prompt.
        let result = SweepResult {
            plain: mode("plain", &[(11, 100), (11, 100)]),
            rows: vec![SweepRow {
                drafter: "ngram",
                drafts: Some(2),
                block: BlockSizeConfig::fixed(3),
                mode: mode("ngram K=2", &[(11, 100), (11, 50)]),
                identical: 2,
            }],
            plain_outputs: Vec::new(),
            mismatches: Vec::new(),
        };
        let table = kinds_table(&result, &prompts);
        let row = table
            .lines()
            .find(|l| l.starts_with("ngram"))
            .unwrap_or_default();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells,
            ["ngram", "2", "10.00", "1.00x", "20.00", "2.00x", "13.33", "1.33x"],
            "{table}"
        );
        assert!(kinds_table(&result, &[prompt("a"), prompt("a")]).is_empty());
    }
}
