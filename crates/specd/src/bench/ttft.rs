//! Time to the first token of a long prompt, plain against speculative with the draft model,
//! in this process: a draft model opens its session by prefilling the whole prompt, which
//! must not delay the first token.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{json, Value};
use specd_core::round_loop::SinkClosed;
use specd_core::{
    BlockSizeConfig, Drafter, Event, EventSink, GenerationRequest, RequestControl, RoundLoop,
    SamplingParams, SeqId, SessionId, StopConditions,
};
use specd_drafter::DraftModelEngine;
use specd_verifier::{LocalVerifier, TargetCarry, TargetModel};

use super::costs::median;
use crate::embedded_drafter::EmbeddedDrafter;
use crate::text::NoText;

/// Tokens each timed request generates: enough that the drafter session opens (it does only
/// once the first token is out and the request goes on).
const TOKENS: usize = 4;

/// The first-token times of both modes on one prompt.
#[derive(Debug, Clone)]
pub struct TtftReport {
    pub prompt_tokens: usize,
    pub plain: Duration,
    pub speculative: Duration,
}

impl TtftReport {
    pub fn ratio(&self) -> f64 {
        let plain = self.plain.as_secs_f64();
        if plain > 0.0 {
            self.speculative.as_secs_f64() / plain
        } else {
            0.0
        }
    }

    pub fn line(&self) -> String {
        format!(
            "time to first token, {}-token prompt (median): plain {:.2} s, speculative \
             (draft model) {:.2} s = {:.2}x plain",
            self.prompt_tokens,
            self.plain.as_secs_f64(),
            self.speculative.as_secs_f64(),
            self.ratio()
        )
    }

    pub fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "plain_s": self.plain.as_secs_f64(),
            "speculative_s": self.speculative.as_secs_f64(),
            "speculative_over_plain": self.ratio(),
        })
    }
}

/// Notes when the first token arrives.
struct FirstToken {
    start: Instant,
    at: Option<Duration>,
}

impl EventSink for FirstToken {
    fn send(
        &mut self,
        event: Event,
    ) -> impl std::future::Future<Output = Result<(), SinkClosed>> + Send {
        if matches!(event, Event::Tokens(_)) && self.at.is_none() {
            self.at = Some(self.start.elapsed());
        }
        std::future::ready(Ok(()))
    }
}

/// Times the first token of `prompt`, plain and speculative alternately, `reps` times each.
pub async fn measure<T: TargetModel>(
    verifier: &LocalVerifier<T>,
    drafter: &EmbeddedDrafter<DraftModelEngine>,
    prompt: &[u32],
    reps: usize,
) -> Result<TtftReport> {
    let mut plain = Vec::with_capacity(reps);
    let mut speculative = Vec::with_capacity(reps);
    let mut id = 1_000_000;
    for _ in 0..reps {
        for spec in [false, true] {
            id += 1;
            let request = GenerationRequest {
                seq: SeqId(id),
                session: SessionId(id),
                prompt_ids: prompt.to_vec(),
                sampling: SamplingParams::GREEDY,
                stop: StopConditions {
                    ignore_eos: true,
                    ..StopConditions::max_tokens(TOKENS)
                },
                block_size: if spec {
                    BlockSizeConfig::fixed(3)
                } else {
                    BlockSizeConfig::PLAIN
                },
            };
            let time = if spec {
                first_token(verifier, Some(drafter), request).await?
            } else {
                first_token::<T, EmbeddedDrafter<DraftModelEngine>>(verifier, None, request).await?
            };
            if spec {
                speculative.push(time);
            } else {
                plain.push(time);
            }
        }
    }
    Ok(TtftReport {
        prompt_tokens: prompt.len(),
        plain: median(plain),
        speculative: median(speculative),
    })
}

async fn first_token<T: TargetModel, D: Drafter<Carry = TargetCarry>>(
    verifier: &LocalVerifier<T>,
    drafter: Option<&D>,
    request: GenerationRequest,
) -> Result<Duration> {
    let mut sink = FirstToken {
        start: Instant::now(),
        at: None,
    };
    RoundLoop::new(verifier, drafter, &NoText)
        .run(request, &mut sink, &RequestControl::default())
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    sink.at
        .ok_or_else(|| anyhow::anyhow!("time to first token: no token was emitted"))
}
