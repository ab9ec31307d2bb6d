//! The CPU engine beside the machine it runs on: the memory read bandwidth, the weight bytes
//! a decode step streams and how close the step comes to streaming them at that bandwidth,
//! verifies of 1..8 tokens, the drafter's step, the prefill of a long prompt and the decode
//! step after it (where attention reads a long K/V cache). These are the figures the engine
//! is held against llama.cpp on.
//!
//! Every repetition measures each quantity once, back to back, and each ratio is the median
//! of its per-repetition ratios: the load of a shared machine drifts within seconds (its read
//! bandwidth by 20% and more), and a ratio of two medians taken at different moments would
//! carry that drift.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};
use specd_models::cpu::{prefetch_hint, ReadPass, ThreadPool};
use specd_models::qwen2::{EngineInfo, KvCache, Qwen2Model};
use specd_verifier::Qwen2Target;

use super::prompts;
use super::quantile::{median, median_of};
use specd::text::PromptText;
use specd_text::TargetText;

/// The widest verify measured: the block sizes the adaptive policy reaches on CPU.
const MAX_VERIFY: usize = 8;
/// Tokens of the long prompt whose prefill is timed.
const PREFILL_TOKENS: usize = 1500;
/// Rows per prefill forward, as the verifier and the drafter prefill a prompt.
const PREFILL_CHUNK: usize = 256;
/// Timed repetitions of every step (and of a pass over the bandwidth buffer), after one
/// unmeasured pass.
const STEP_REPS: usize = 11;
/// Timed prefills of each model, after one unmeasured pass (a prefill takes seconds).
const PREFILL_REPS: usize = 3;

/// One model's side of the report.
struct Side {
    info: EngineInfo,
    /// Median decode step (the greedy next token after one new token).
    step: Duration,
    /// Median prefill of the long prompt into a fresh cache.
    prefill: Duration,
    /// Median decode step with the long prompt in the cache.
    long_step: Duration,
    /// Median over repetitions of streamed bytes / step time / that repetition's read
    /// bandwidth.
    bandwidth_use: f64,
}

/// The drafter's steps over the target's, median over repetitions of the paired ratios.
struct DrafterCost {
    step: f64,
    prefill: f64,
}

pub struct EngineReport {
    /// Median read bandwidth of the repetitions' passes, bytes per second.
    bandwidth: f64,
    /// Tokens in the cache under every step measurement.
    context: usize,
    prefill_tokens: usize,
    target: Side,
    /// `verify[n - 1]`: median verify of n tokens (forward, greedy token of every row);
    /// `verify[0]` is the decode step.
    verify: Vec<Duration>,
    /// `verify_cost[n - 1]`: median over repetitions of verify of n ÷ decode step.
    verify_cost: Vec<f64>,
    drafter: Option<(Side, DrafterCost)>,
    /// The prefetch hint single-pass matmuls settled on (`None`: still measuring).
    prefetch: Option<&'static str>,
}

/// Bytes per second over one step, as a fraction of `bandwidth`.
fn use_of(streamed: usize, step: Duration, bandwidth: f64) -> f64 {
    let secs = step.as_secs_f64();
    if secs > 0.0 && bandwidth > 0.0 {
        streamed as f64 / secs / bandwidth
    } else {
        0.0
    }
}

fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<Duration> {
    let start = Instant::now();
    f()?;
    Ok(start.elapsed())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `ids` after the cache's contents in chunks, the greedy token after the last one computed
/// as a generation would.
fn prefill_into(model: &Qwen2Model, cache: &mut KvCache, ids: &[u32]) -> Result<u32> {
    let chunks: Vec<&[u32]> = ids.chunks(PREFILL_CHUNK).collect();
    let (last, head) = chunks.split_last().context("prefill: empty prompt")?;
    for piece in head {
        model.forward_block_hidden(piece, cache)?;
    }
    Ok(model.forward_block_argmax(last, cache)?)
}

/// A model with its cache holding `context`, and the length to roll back to.
struct Primed<'a> {
    model: &'a Qwen2Model,
    cache: KvCache,
    base: usize,
}

impl<'a> Primed<'a> {
    fn new(model: &'a Qwen2Model, context: &[u32]) -> Result<Self> {
        let mut cache = model.new_cache()?;
        prefill_into(model, &mut cache, context)?;
        Ok(Self::at(model, cache))
    }

    /// Steps after what `cache` already holds.
    fn at(model: &'a Qwen2Model, cache: KvCache) -> Self {
        let base = cache.len();
        Self { model, cache, base }
    }

    fn decode_step(&mut self, token: u32) -> Result<Duration> {
        let t = timed(|| Ok(self.model.forward_block_argmax(&[token], &mut self.cache)?))?;
        self.cache.truncate(self.base)?;
        Ok(t)
    }

    fn verify(&mut self, tokens: &[u32]) -> Result<Duration> {
        let t = timed(|| {
            let hidden = self.model.forward_block_hidden(tokens, &mut self.cache)?;
            Ok(self.model.argmax(&hidden)?)
        })?;
        self.cache.truncate(self.base)?;
        Ok(t)
    }
}

/// The engine section of a GGUF target's benchmark: steps at `context`, prefill of a
/// [`PREFILL_TOKENS`]-token prompt; `None` when the target does not run on the CPU engine.
pub fn measure_gguf(
    target: &Qwen2Target,
    drafter: Option<&Qwen2Model>,
    text: &TargetText,
    context: &[u32],
) -> Result<Option<EngineReport>> {
    if target.model().engine_info().is_none() {
        return Ok(None);
    }
    let long = prompts::long_prompt(&|s| text.encode_raw(s), PREFILL_TOKENS)?;
    measure(target.model(), drafter, context, &long)
}

/// Measures the engine on `target` (and `drafter`), steps at `context`, prefill on
/// `long_prompt`; `None` when the target does not run on the CPU engine.
fn measure(
    target: &Qwen2Model,
    drafter: Option<&Qwen2Model>,
    context: &[u32],
    long_prompt: &[u32],
) -> Result<Option<EngineReport>> {
    let Some(target_info) = target.engine_info() else {
        return Ok(None);
    };
    let drafter = drafter.and_then(|m| m.engine_info().map(|info| (m, info)));
    let pass = ReadPass::new();
    let mut bandwidth = Vec::with_capacity(STEP_REPS);
    let widths: Vec<Vec<u32>> = (1..=MAX_VERIFY)
        .map(|n| context.iter().copied().cycle().take(n).collect())
        .collect();
    let token = *context.first().context("engine: empty context")?;
    let mut t = Primed::new(target, context)?;
    let mut d = drafter
        .as_ref()
        .map(|(m, _)| Primed::new(m, context))
        .transpose()?;
    let mut verify: Vec<Vec<Duration>> = (0..MAX_VERIFY).map(|_| Vec::new()).collect();
    let mut draft = Vec::with_capacity(STEP_REPS);
    // Every quantity once per repetition, so drift in machine load hits them alike.
    for rep in 0..=STEP_REPS {
        let read = pass.run(ThreadPool::global());
        let step = t.decode_step(token)?;
        let wider = widths[1..]
            .iter()
            .map(|w| t.verify(w))
            .collect::<Result<Vec<_>>>()?;
        let draft_step = d.as_mut().map(|d| d.decode_step(token)).transpose()?;
        if rep > 0 {
            for (samples, s) in verify.iter_mut().zip(std::iter::once(step).chain(wider)) {
                samples.push(s);
            }
            draft.extend(draft_step);
            bandwidth.push(read);
        }
    }
    drop(pass);
    let mut target_prefill = Vec::with_capacity(PREFILL_REPS);
    let mut drafter_prefill = Vec::with_capacity(PREFILL_REPS);
    // The last prefill's caches stay for the decode steps at the long context.
    let mut long = None;
    for rep in 0..=PREFILL_REPS {
        let mut t_cache = target.new_cache()?;
        let tp = timed(|| prefill_into(target, &mut t_cache, long_prompt))?;
        let mut d_cache = drafter.as_ref().map(|(m, _)| m.new_cache()).transpose()?;
        let dp = drafter
            .as_ref()
            .zip(d_cache.as_mut())
            .map(|((m, _), cache)| timed(|| prefill_into(m, cache, long_prompt)))
            .transpose()?;
        if rep > 0 {
            target_prefill.push(tp);
            drafter_prefill.extend(dp);
        }
        long = Some((t_cache, d_cache));
    }
    let (t_cache, d_cache) = long.context("prefill: no repetition ran")?;
    let mut t = Primed::at(target, t_cache);
    let mut d = drafter
        .as_ref()
        .zip(d_cache)
        .map(|((m, _), cache)| Primed::at(m, cache));
    let mut target_long = Vec::with_capacity(STEP_REPS);
    let mut drafter_long = Vec::with_capacity(STEP_REPS);
    for rep in 0..=STEP_REPS {
        let step = t.decode_step(token)?;
        let draft_step = d.as_mut().map(|d| d.decode_step(token)).transpose()?;
        if rep > 0 {
            target_long.push(step);
            drafter_long.extend(draft_step);
        }
    }
    let samples = Samples {
        bandwidth,
        verify,
        draft,
        target_prefill,
        drafter_prefill,
        target_long,
        drafter_long,
    };
    let mut report = EngineReport::from_samples(
        target_info,
        drafter.map(|(_, info)| info),
        context.len(),
        long_prompt.len(),
        &samples,
    );
    report.prefetch = prefetch_hint();
    Ok(Some(report))
}

/// What the repetitions measured, sample `i` of every list from repetition `i`.
struct Samples {
    /// Read bandwidth, bytes per second.
    bandwidth: Vec<f64>,
    /// `verify[n - 1]`: verifies of n tokens; `verify[0]` are the decode steps.
    verify: Vec<Vec<Duration>>,
    /// Drafter decode steps (empty without a drafter).
    draft: Vec<Duration>,
    target_prefill: Vec<Duration>,
    drafter_prefill: Vec<Duration>,
    /// Decode steps with the long prompt in the cache.
    target_long: Vec<Duration>,
    drafter_long: Vec<Duration>,
}

impl EngineReport {
    fn from_samples(
        target: EngineInfo,
        drafter: Option<EngineInfo>,
        context: usize,
        prefill_tokens: usize,
        s: &Samples,
    ) -> Self {
        let steps = &s.verify[0];
        let paired = |a: &[Duration], b: &[Duration]| {
            median_of(
                &a.iter()
                    .zip(b)
                    .map(|(&a, &b)| ratio(a, b))
                    .collect::<Vec<_>>(),
            )
        };
        let bandwidth_use = |streamed: usize, steps: &[Duration]| {
            let uses: Vec<f64> = steps
                .iter()
                .zip(&s.bandwidth)
                .map(|(&step, &bandwidth)| use_of(streamed, step, bandwidth))
                .collect();
            median_of(&uses)
        };
        let drafter = drafter.map(|info| {
            let cost = DrafterCost {
                step: paired(&s.draft, steps),
                prefill: paired(&s.drafter_prefill, &s.target_prefill),
            };
            let side = Side {
                bandwidth_use: bandwidth_use(info.streamed_bytes, &s.draft),
                info,
                step: median(&s.draft),
                prefill: median(&s.drafter_prefill),
                long_step: median(&s.drafter_long),
            };
            (side, cost)
        });
        Self {
            bandwidth: median_of(&s.bandwidth),
            context,
            prefill_tokens,
            target: Side {
                bandwidth_use: bandwidth_use(target.streamed_bytes, steps),
                info: target,
                step: median(steps),
                prefill: median(&s.target_prefill),
                long_step: median(&s.target_long),
            },
            verify: s.verify.iter().map(|v| median(v)).collect(),
            verify_cost: s.verify.iter().map(|v| paired(v, steps)).collect(),
            drafter,
            prefetch: None,
        }
    }
}

impl Side {
    fn prefill_tokens_per_second(&self, tokens: usize) -> f64 {
        let secs = self.prefill.as_secs_f64();
        if secs > 0.0 {
            tokens as f64 / secs
        } else {
            0.0
        }
    }
}

fn ratio(a: Duration, b: Duration) -> f64 {
    let b = b.as_secs_f64();
    if b > 0.0 {
        a.as_secs_f64() / b
    } else {
        0.0
    }
}

impl EngineReport {
    pub fn table(&self) -> String {
        let gb = |bytes: usize| bytes as f64 / 1e9;
        let t = &self.target;
        let mut out = format!(
            "engine: {} kernels, prefetch {}, {} threads, read bandwidth {:.1} GB/s; steps at a \
             {}-token context (median of {STEP_REPS})\n",
            t.info.kernels,
            self.prefetch.unwrap_or("undecided"),
            t.info.threads,
            self.bandwidth / 1e9,
            self.context
        );
        out.push_str(&format!(
            "target: decode step {:.1} ms streaming {:.3} GB (resident {:.3} GB) = {:.0}% of \
             read bandwidth\nverify of n tokens (ms, x decode step):",
            ms(t.step),
            gb(t.info.streamed_bytes),
            gb(t.info.resident_bytes),
            t.bandwidth_use * 100.0
        ));
        for (i, (v, c)) in self.verify.iter().zip(&self.verify_cost).enumerate() {
            out.push_str(&format!("  n={} {:.1} ({c:.2})", i + 1, ms(*v)));
        }
        out.push('\n');
        if let Some((d, cost)) = &self.drafter {
            out.push_str(&format!(
                "drafter: step {:.1} ms = {:.2} target steps, streaming {:.3} GB = {:.0}% of \
                 read bandwidth\n",
                ms(d.step),
                cost.step,
                gb(d.info.streamed_bytes),
                d.bandwidth_use * 100.0
            ));
        }
        let n = self.prefill_tokens;
        out.push_str(&format!(
            "prefill of {n} tokens in chunks of {PREFILL_CHUNK} (median of {PREFILL_REPS}): \
             target {:.2} s ({:.0} tok/s)",
            t.prefill.as_secs_f64(),
            t.prefill_tokens_per_second(n)
        ));
        if let Some((d, cost)) = &self.drafter {
            out.push_str(&format!(
                ", drafter {:.2} s ({:.0} tok/s) = {:.2} of the target's",
                d.prefill.as_secs_f64(),
                d.prefill_tokens_per_second(n),
                cost.prefill
            ));
        }
        out.push('\n');
        out.push_str(&format!(
            "decode step with those {n} tokens in the cache (median of {STEP_REPS}): target \
             {:.1} ms",
            ms(t.long_step)
        ));
        if let Some((d, _)) = &self.drafter {
            out.push_str(&format!(", drafter {:.1} ms", ms(d.long_step)));
        }
        out.push('\n');
        out
    }

    pub fn json(&self) -> Value {
        let t = &self.target;
        let n = self.prefill_tokens;
        let side = |s: &Side| {
            json!({
                "streamed_bytes": s.info.streamed_bytes,
                "resident_bytes": s.info.resident_bytes,
                "reencoded_tensors": s.info.reencoded_tensors,
                "decode_step_ms": ms(s.step),
                "bandwidth_use": s.bandwidth_use,
                "prefill_seconds": s.prefill.as_secs_f64(),
                "prefill_tokens_per_second": s.prefill_tokens_per_second(n),
                "decode_step_long_ms": ms(s.long_step),
            })
        };
        let mut target = side(t);
        target["verify_ms"] = json!(self.verify.iter().map(|&v| ms(v)).collect::<Vec<_>>());
        target["verify_cost"] = json!(self.verify_cost);
        let drafter = self.drafter.as_ref().map(|(d, cost)| {
            let mut v = side(d);
            v["step_cost"] = json!(cost.step);
            v["prefill_over_target"] = json!(cost.prefill);
            v
        });
        json!({
            "read_bandwidth_gbs": self.bandwidth / 1e9,
            "kernels": t.info.kernels,
            "prefetch": self.prefetch,
            "threads": t.info.threads,
            "context_tokens": self.context,
            "step_reps": STEP_REPS,
            "prefill_tokens": n,
            "prefill_chunk": PREFILL_CHUNK,
            "prefill_reps": PREFILL_REPS,
            "target": target,
            "drafter": drafter,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(streamed: usize) -> EngineInfo {
        EngineInfo {
            kernels: "avx2",
            threads: 2,
            streamed_bytes: streamed,
            resident_bytes: streamed + 1,
            reencoded_tensors: 0,
            narrowed_tensors: 0,
        }
    }

    fn ms_list(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    /// Three repetitions, the second on a machine at half speed: every ratio of one
    /// repetition's samples is the same.
    fn report() -> EngineReport {
        let samples = Samples {
            bandwidth: vec![10e9, 5e9, 10e9],
            verify: vec![
                ms_list(&[125, 250, 125]),
                ms_list(&[150, 300, 150]),
                ms_list(&[250, 500, 250]),
            ],
            draft: ms_list(&[50, 100, 50]),
            target_prefill: ms_list(&[10_000, 20_000, 10_000]),
            drafter_prefill: ms_list(&[3_000, 6_000, 3_000]),
            target_long: ms_list(&[140, 280, 140]),
            drafter_long: ms_list(&[60, 120, 60]),
        };
        EngineReport::from_samples(
            info(1_000_000_000),
            Some(info(400_000_000)),
            40,
            1500,
            &samples,
        )
    }

    #[test]
    fn ratios_pair_the_samples_of_one_repetition() {
        // A slow repetition first: the median of the ratios differs from the ratio of the
        // medians in every measure.
        let samples = Samples {
            bandwidth: vec![4e9, 10e9, 10e9],
            verify: vec![ms_list(&[250, 100, 125]), ms_list(&[325, 130, 140])],
            draft: ms_list(&[100, 35, 40]),
            target_prefill: ms_list(&[20_000, 10_000, 10_000]),
            drafter_prefill: ms_list(&[6_000, 2_000, 3_500]),
            target_long: ms_list(&[300, 150, 160]),
            drafter_long: ms_list(&[120, 50, 60]),
        };
        let r = EngineReport::from_samples(
            info(1_000_000_000),
            Some(info(400_000_000)),
            40,
            1500,
            &samples,
        );
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert_eq!(r.target.step, Duration::from_millis(125));
        assert_eq!(r.bandwidth, 10e9);
        // Per repetition 1.3, 1.3, 1.12 (medians: 140 / 125 = 1.12).
        assert!(close(r.verify_cost[1], 1.3), "{:?}", r.verify_cost);
        let (_, cost) = r.drafter.as_ref().unwrap();
        // Per repetition 0.4, 0.35, 0.32 (medians: 40 / 125 = 0.32).
        assert!(close(cost.step, 0.35), "{}", cost.step);
        // Per repetition 0.3, 0.2, 0.35 (medians: 0.35).
        assert!(close(cost.prefill, 0.3), "{}", cost.prefill);
        // 1 GB per step, per repetition 1.0, 1.0, 0.8 (medians: 0.8).
        assert!(
            close(r.target.bandwidth_use, 1.0),
            "{}",
            r.target.bandwidth_use
        );
    }

    #[test]
    fn json_carries_ratios_to_the_target_step_and_bandwidth_use() {
        let v = report().json();
        assert_eq!(v["kernels"], "avx2");
        assert_eq!(v["read_bandwidth_gbs"], 10.0);
        assert_eq!(v["target"]["verify_cost"], json!([1.0, 1.2, 2.0]));
        // 1 GB in 125 ms is 8 GB/s of 10.
        assert_eq!(v["target"]["bandwidth_use"], 0.8);
        assert_eq!(v["target"]["prefill_tokens_per_second"], 150.0);
        assert_eq!(v["drafter"]["step_cost"], 0.4);
        assert_eq!(v["drafter"]["prefill_over_target"], 0.3);
        assert_eq!(v["target"]["decode_step_long_ms"], 140.0);
        assert_eq!(v["drafter"]["decode_step_long_ms"], 60.0);
    }

    #[test]
    fn table_names_every_measure() {
        let text = report().table();
        for part in [
            "read bandwidth 10.0 GB/s",
            "decode step 125.0 ms",
            "= 80% of read bandwidth",
            "n=3 250.0 (2.00)",
            "step 50.0 ms = 0.40 target steps",
            "prefill of 1500 tokens",
            "= 0.30 of the target's",
            "decode step with those 1500 tokens in the cache",
            "target 140.0 ms, drafter 60.0 ms",
        ] {
            assert!(text.contains(part), "{part:?} missing from\n{text}");
        }
    }
}
