//! The CPU engine beside the machine it runs on: the memory read bandwidth, the weight bytes
//! a decode step streams and how close the step comes to streaming them at that bandwidth,
//! verifies of 1..8 tokens, the drafter's step, and the prefill of a long prompt. These are
//! the figures the engine is held against llama.cpp on.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};
use specd_models::cpu::{read_bandwidth, ThreadPool};
use specd_models::qwen2::{EngineInfo, KvCache, Qwen2Model};
use specd_verifier::Qwen2Target;

use super::prompts;
use super::quantile::median;
use specd::text::PromptText;
use specd_text::TargetText;

/// The widest verify measured: the block sizes the adaptive policy reaches on CPU.
const MAX_VERIFY: usize = 8;
/// Tokens of the long prompt whose prefill is timed.
const PREFILL_TOKENS: usize = 1500;
/// Rows per prefill forward, as the verifier and the drafter prefill a prompt.
const PREFILL_CHUNK: usize = 256;
/// Passes over the bandwidth buffer; the best one counts, as the steps are medians of
/// undisturbed runs too.
const BANDWIDTH_RUNS: usize = 3;
/// Timed repetitions of every step, after one unmeasured pass.
const STEP_REPS: usize = 7;
/// Timed prefills of each model, after one unmeasured pass (a prefill takes seconds).
const PREFILL_REPS: usize = 3;

/// One model's side of the report.
struct Side {
    info: EngineInfo,
    /// Median decode step (the greedy next token after one new token).
    step: Duration,
    /// Median prefill of the long prompt into a fresh cache.
    prefill: Duration,
}

pub struct EngineReport {
    /// Bytes per second.
    bandwidth: f64,
    /// Tokens in the cache under every step measurement.
    context: usize,
    prefill_tokens: usize,
    target: Side,
    /// `verify[n - 1]`: median verify of n tokens (forward, greedy token of every row);
    /// `verify[0]` is the decode step.
    verify: Vec<Duration>,
    drafter: Option<Side>,
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
        let base = cache.len();
        Ok(Self { model, cache, base })
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
    let bandwidth = read_bandwidth(ThreadPool::global(), BANDWIDTH_RUNS);
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
        }
    }
    let verify: Vec<Duration> = verify.into_iter().map(|samples| median(&samples)).collect();
    let mut target_prefill = Vec::with_capacity(PREFILL_REPS);
    let mut drafter_prefill = Vec::with_capacity(PREFILL_REPS);
    for rep in 0..=PREFILL_REPS {
        let tp = timed(|| prefill_into(target, &mut target.new_cache()?, long_prompt))?;
        let dp = drafter
            .as_ref()
            .map(|(m, _)| timed(|| prefill_into(m, &mut m.new_cache()?, long_prompt)))
            .transpose()?;
        if rep > 0 {
            target_prefill.push(tp);
            drafter_prefill.extend(dp);
        }
    }
    Ok(Some(EngineReport {
        bandwidth,
        context: context.len(),
        prefill_tokens: long_prompt.len(),
        target: Side {
            info: target_info,
            step: verify[0],
            prefill: median(&target_prefill),
        },
        verify,
        drafter: drafter.map(|(_, info)| Side {
            info,
            step: median(&draft),
            prefill: median(&drafter_prefill),
        }),
    }))
}

impl Side {
    /// Streamed bytes over the step time, as a fraction of the read bandwidth.
    fn bandwidth_use(&self, bandwidth: f64) -> f64 {
        let secs = self.step.as_secs_f64();
        if secs > 0.0 && bandwidth > 0.0 {
            self.info.streamed_bytes as f64 / secs / bandwidth
        } else {
            0.0
        }
    }

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
    fn verify_cost(&self) -> Vec<f64> {
        self.verify
            .iter()
            .map(|&v| ratio(v, self.target.step))
            .collect()
    }

    pub fn table(&self) -> String {
        let gb = |bytes: usize| bytes as f64 / 1e9;
        let t = &self.target;
        let mut out = format!(
            "engine: {} kernels, {} threads, read bandwidth {:.1} GB/s; steps at a {}-token \
             context (median of {STEP_REPS})\n",
            t.info.kernels,
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
            t.bandwidth_use(self.bandwidth) * 100.0
        ));
        for (i, (v, c)) in self.verify.iter().zip(self.verify_cost()).enumerate() {
            out.push_str(&format!("  n={} {:.1} ({c:.2})", i + 1, ms(*v)));
        }
        out.push('\n');
        if let Some(d) = &self.drafter {
            out.push_str(&format!(
                "drafter: step {:.1} ms = {:.2} target steps, streaming {:.3} GB = {:.0}% of \
                 read bandwidth\n",
                ms(d.step),
                ratio(d.step, t.step),
                gb(d.info.streamed_bytes),
                d.bandwidth_use(self.bandwidth) * 100.0
            ));
        }
        let n = self.prefill_tokens;
        out.push_str(&format!(
            "prefill of {n} tokens in chunks of {PREFILL_CHUNK} (median of {PREFILL_REPS}): \
             target {:.2} s ({:.0} tok/s)",
            t.prefill.as_secs_f64(),
            t.prefill_tokens_per_second(n)
        ));
        if let Some(d) = &self.drafter {
            out.push_str(&format!(
                ", drafter {:.2} s ({:.0} tok/s) = {:.2} of the target's",
                d.prefill.as_secs_f64(),
                d.prefill_tokens_per_second(n),
                ratio(d.prefill, t.prefill)
            ));
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
                "bandwidth_use": s.bandwidth_use(self.bandwidth),
                "prefill_seconds": s.prefill.as_secs_f64(),
                "prefill_tokens_per_second": s.prefill_tokens_per_second(n),
            })
        };
        let mut target = side(t);
        target["verify_ms"] = json!(self.verify.iter().map(|&v| ms(v)).collect::<Vec<_>>());
        target["verify_cost"] = json!(self.verify_cost());
        let drafter = self.drafter.as_ref().map(|d| {
            let mut v = side(d);
            v["step_cost"] = json!(ratio(d.step, t.step));
            v["prefill_over_target"] = json!(ratio(d.prefill, t.prefill));
            v
        });
        json!({
            "read_bandwidth_gbs": self.bandwidth / 1e9,
            "kernels": t.info.kernels,
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

    fn side(streamed: usize, step_ms: u64, prefill_ms: u64) -> Side {
        Side {
            info: EngineInfo {
                kernels: "avx2",
                threads: 2,
                streamed_bytes: streamed,
                resident_bytes: streamed + 1,
                reencoded_tensors: 0,
            },
            step: Duration::from_millis(step_ms),
            prefill: Duration::from_millis(prefill_ms),
        }
    }

    fn report() -> EngineReport {
        EngineReport {
            bandwidth: 10e9,
            context: 40,
            prefill_tokens: 1500,
            target: side(1_000_000_000, 125, 10_000),
            verify: [125, 150, 250].map(Duration::from_millis).to_vec(),
            drafter: Some(side(400_000_000, 50, 3_000)),
        }
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
        ] {
            assert!(text.contains(part), "{part:?} missing from\n{text}");
        }
    }
}
