//! Time to the first token of a long prompt, plain against speculative with the draft model,
//! in this process and split over loopback gRPC: a draft model opens its session by
//! prefilling the whole prompt, which must not delay the first token.

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

use super::quantile::median;
use super::split::{self, SplitBlock};
use specd::embedded_drafter::EmbeddedDrafter;
use specd_text::TargetText;

/// Tokens each timed request generates: enough that the drafter session opens (it does only
/// once the first token is out and the request goes on).
const TOKENS: usize = 4;
/// Tokens of a split speculative request: enough that the drafter's open (its prefill of the
/// whole prompt, in another service) ends within the request, so that it does not run on
/// into the next measurement on the same cores.
const SPLIT_SPECULATIVE_TOKENS: usize = 256;

/// The first-token times of plain and speculative decoding in one mode.
#[derive(Debug, Clone, Copy)]
pub struct TtftPair {
    pub plain: Duration,
    pub speculative: Duration,
}

impl TtftPair {
    pub fn ratio(&self) -> f64 {
        let plain = self.plain.as_secs_f64();
        if plain > 0.0 {
            self.speculative.as_secs_f64() / plain
        } else {
            0.0
        }
    }

    fn json(&self) -> Value {
        json!({
            "plain_s": self.plain.as_secs_f64(),
            "speculative_s": self.speculative.as_secs_f64(),
            "speculative_over_plain": self.ratio(),
        })
    }
}

/// The first-token times on one prompt, in this process and split.
#[derive(Debug, Clone)]
pub struct TtftReport {
    pub prompt_tokens: usize,
    pub embedded: TtftPair,
    pub split: Option<TtftPair>,
}

impl TtftReport {
    pub fn line(&self) -> String {
        let mut line = format!(
            "time to first token, {}-token prompt (median): in process, plain {:.2} s, \
             speculative (draft model) {:.2} s = {:.2}x plain",
            self.prompt_tokens,
            self.embedded.plain.as_secs_f64(),
            self.embedded.speculative.as_secs_f64(),
            self.embedded.ratio()
        );
        if let Some(split) = &self.split {
            line.push_str(&format!(
                "; split (gRPC), plain {:.2} s, speculative {:.2} s = {:.2}x plain",
                split.plain.as_secs_f64(),
                split.speculative.as_secs_f64(),
                split.ratio()
            ));
        }
        line
    }

    pub fn json(&self) -> Value {
        let mut out = self.embedded.json();
        out["prompt_tokens"] = json!(self.prompt_tokens);
        out["split"] = json!(self.split.as_ref().map(TtftPair::json));
        out
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

/// Times the first token of `prompt`, plain and speculative alternately, `reps` times each,
/// in this process and then, when `router_url` is given, through that router (which must
/// draft with the draft model).
pub async fn measure<T: TargetModel>(
    verifier: &LocalVerifier<T>,
    drafter: &EmbeddedDrafter<DraftModelEngine>,
    router_url: Option<&str>,
    prompt: &[u32],
    reps: usize,
) -> Result<TtftReport> {
    let embedded = measure_embedded(verifier, drafter, prompt, reps).await?;
    let split = match router_url {
        Some(url) => Some(measure_split(url, prompt, reps).await?),
        None => None,
    };
    Ok(TtftReport {
        prompt_tokens: prompt.len(),
        embedded,
        split,
    })
}

async fn measure_split(router_url: &str, prompt: &[u32], reps: usize) -> Result<TtftPair> {
    let mut samples = Samples::default();
    for _ in 0..reps {
        for spec in [false, true] {
            let (block, tokens) = if spec {
                (SplitBlock::Fixed(3), SPLIT_SPECULATIVE_TOKENS)
            } else {
                (SplitBlock::Plain, TOKENS)
            };
            let run = split::generate(router_url, prompt, tokens, block).await?;
            let time = run
                .first_token
                .ok_or_else(|| anyhow::anyhow!("time to first token: no token was streamed"))?;
            samples.push(spec, time);
        }
    }
    Ok(samples.pair())
}

async fn measure_embedded<T: TargetModel>(
    verifier: &LocalVerifier<T>,
    drafter: &EmbeddedDrafter<DraftModelEngine>,
    prompt: &[u32],
    reps: usize,
) -> Result<TtftPair> {
    let mut samples = Samples::default();
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
                cache_scope: Default::default(),
                forced_drafts: 0,
                rules: Default::default(),
                top_logprobs: None,
            };
            let time = if spec {
                first_token(verifier, Some(drafter), request).await?
            } else {
                first_token::<T, EmbeddedDrafter<DraftModelEngine>>(verifier, None, request).await?
            };
            samples.push(spec, time);
        }
    }
    Ok(samples.pair())
}

/// First-token times of one mode, plain and speculative.
#[derive(Default)]
struct Samples {
    plain: Vec<Duration>,
    speculative: Vec<Duration>,
}

impl Samples {
    fn push(&mut self, speculative: bool, time: Duration) {
        if speculative {
            self.speculative.push(time);
        } else {
            self.plain.push(time);
        }
    }

    fn pair(self) -> TtftPair {
        TtftPair {
            plain: median(&self.plain),
            speculative: median(&self.speculative),
        }
    }
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
    RoundLoop::new(verifier, drafter, &TargetText::default())
        .run(request, &mut sink, &RequestControl::default())
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    sink.at
        .ok_or_else(|| anyhow::anyhow!("time to first token: no token was emitted"))
}
