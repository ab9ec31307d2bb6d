//! Direct measurements of the step costs the speed-up model needs: one target decode step,
//! one target verify of n tokens, and one draft-model step, each timed on its own with the
//! cache rolled back after every repetition so all run at the same context length.

use std::time::{Duration, Instant};

use super::quantile::median;

use anyhow::Result;
use serde_json::{json, Value};
use specd_core::SamplingParams;
use specd_models::qwen2::Qwen2Model;
use specd_models::SeqBlock;
use specd_verifier::{block_tokens, HeadRows, TargetModel};

/// Median step times, and the costs relative to one target decode step.
#[derive(Debug, Clone)]
pub struct StepCosts {
    /// `verify[n - 1]`: median time to verify n tokens (forward of n rows, the greedy token
    /// of every row in one LM head pass as the verifier takes it, rollback). `verify[0]` is one plain decode step.
    pub verify: Vec<Duration>,
    /// Median time of one draft-model step (a 1-token forward and its argmax), if measured.
    pub draft_step: Option<Duration>,
}

impl StepCosts {
    /// One target decode step.
    pub fn decode(&self) -> Duration {
        self.verify.first().copied().unwrap_or_default()
    }

    /// A verify of `width` tokens in decode steps (`None` beyond the measured widths).
    pub fn verify_cost(&self, width: usize) -> Option<f64> {
        let step = self.decode().as_secs_f64();
        let t = self.verify.get(width.checked_sub(1)?)?.as_secs_f64();
        (step > 0.0).then(|| t / step)
    }

    /// One draft-model step in decode steps (0 without a draft model).
    pub fn draft_cost(&self) -> f64 {
        let step = self.decode().as_secs_f64();
        match self.draft_step {
            Some(d) if step > 0.0 => d.as_secs_f64() / step,
            _ => 0.0,
        }
    }

    pub fn table(&self) -> String {
        let mut out = format!(
            "measured step costs (median): target decode step {:.1} ms",
            self.decode().as_secs_f64() * 1e3
        );
        if let Some(d) = self.draft_step {
            out.push_str(&format!(
                "; draft-model step {:.1} ms = {:.2} steps",
                d.as_secs_f64() * 1e3,
                self.draft_cost()
            ));
        }
        out.push_str("\nverify of n tokens:");
        for (i, t) in self.verify.iter().enumerate() {
            out.push_str(&format!(
                "  n={} {:.1} ms ({:.2})",
                i + 1,
                t.as_secs_f64() * 1e3,
                self.verify_cost(i + 1).unwrap_or(0.0)
            ));
        }
        out.push('\n');
        out
    }

    pub fn json(&self) -> Value {
        json!({
            "decode_step_ms": self.decode().as_secs_f64() * 1e3,
            "draft_step_ms": self.draft_step.map(|d| d.as_secs_f64() * 1e3),
            "draft_step_cost": self.draft_cost(),
            "verify_ms": self.verify.iter().map(|t| t.as_secs_f64() * 1e3).collect::<Vec<_>>(),
            "verify_cost": (1..=self.verify.len())
                .map(|n| self.verify_cost(n))
                .collect::<Vec<_>>(),
        })
    }
}

/// Times verifies of 1..=`max_width` tokens on top of `context`, `reps` times each after one
/// unmeasured pass; widths are interleaved so load drift hits them alike.
pub fn measure_target<T: TargetModel>(
    target: &T,
    context: &[u32],
    max_width: usize,
    reps: usize,
) -> Result<Vec<Duration>> {
    let mut cache = target.new_cache()?;
    target.prefill(&mut cache, context)?;
    let base = target.cache_len(&cache);
    let greedy = SamplingParams::default();
    let mut samples = vec![Vec::with_capacity(reps); max_width];
    for rep in 0..=reps {
        for width in 1..=max_width {
            let tokens: Vec<u32> = context.iter().copied().cycle().take(width).collect();
            let start = Instant::now();
            let hidden = target.forward_blocks(&mut [SeqBlock::chain(&mut cache, &tokens)])?;
            let rows = hidden
                .first()
                .ok_or_else(|| anyhow::anyhow!("the target returned no hidden states"))?;
            block_tokens(
                target,
                HeadRows {
                    hidden: rows,
                    sampling: &greedy,
                    output_index_base: 0,
                    depths: &[],
                    shaping: Default::default(),
                },
            )?;
            let elapsed = start.elapsed();
            target.truncate(&mut cache, base)?;
            if rep > 0 {
                samples[width - 1].push(elapsed);
            }
        }
    }
    Ok(samples
        .into_iter()
        .map(|samples| median(&samples))
        .collect())
}

/// Times one draft-model step on top of `context`: a one-token forward and its greedy token
/// among the ids below `draft_vocab`, as the draft-model drafter computes it (no logits are
/// materialised on CPU).
pub fn measure_draft_model(
    model: &Qwen2Model,
    draft_vocab: usize,
    context: &[u32],
    reps: usize,
) -> Result<Duration> {
    let mut cache = model.new_cache()?;
    model.forward_block_hidden(context, &mut cache)?;
    let base = cache.len();
    let token = context.last().copied().unwrap_or(0);
    let mut samples = Vec::with_capacity(reps);
    for rep in 0..=reps {
        let start = Instant::now();
        let hidden = model.forward_block_hidden(&[token], &mut cache)?;
        model.argmax_below(&hidden, draft_vocab)?;
        let elapsed = start.elapsed();
        cache.truncate(base)?;
        if rep > 0 {
            samples.push(elapsed);
        }
    }
    Ok(median(&samples))
}
