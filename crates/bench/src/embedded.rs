//! Generations in this process through the core round loop, with timed verifier and drafter.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Result;
use specd_core::round_loop::SinkClosed;
use specd_core::{
    BlockSizeConfig, Drafter, Event, EventSink, GenerationRequest, HybridDrafter, NgramDrafter,
    NoDrafter, RequestControl, RoundLoop, SamplingParams, SeqId, SessionId, StopConditions,
};
use specd_verifier::{LocalVerifier, TargetCarry, TargetModel};

use super::report::{ModeResult, RunSample};
use super::timing::{RoundClock, TimedDrafter, TimedVerifier};
use specd::embedded_drafter::EmbeddedDrafter as InProcess;
use specd_drafter::{DraftModelEngine, MtpEngine};
use specd_text::TargetText;

/// The in-process drafter being compared with plain decoding.
pub enum EmbeddedDrafter {
    Ngram,
    Mtp(Box<InProcess<MtpEngine>>),
    DraftModel(Box<InProcess<DraftModelEngine>>),
    /// Prompt lookup in front of the MTP assistant.
    HybridMtp(Box<InProcess<MtpEngine>>),
    /// Prompt lookup in front of the draft model.
    HybridDraftModel(Box<InProcess<DraftModelEngine>>),
}

impl EmbeddedDrafter {
    /// The draft model this drafter runs, if any (benchmarks time it directly).
    pub fn draft_model(&self) -> Option<&InProcess<DraftModelEngine>> {
        match self {
            EmbeddedDrafter::DraftModel(dm) | EmbeddedDrafter::HybridDraftModel(dm) => Some(dm),
            EmbeddedDrafter::Ngram | EmbeddedDrafter::Mtp(_) | EmbeddedDrafter::HybridMtp(_) => {
                None
            }
        }
    }
}

enum Timed {
    Ngram(TimedDrafter<NgramDrafter<TargetCarry>>),
    Mtp(Box<TimedDrafter<InProcess<MtpEngine>>>),
    DraftModel(Box<TimedDrafter<InProcess<DraftModelEngine>>>),
    HybridMtp(Box<TimedDrafter<HybridDrafter<InProcess<MtpEngine>>>>),
    HybridDraftModel(Box<TimedDrafter<HybridDrafter<InProcess<DraftModelEngine>>>>),
}

/// Keeps the token ids; no text, as the split modes send token ids and get no text back
/// either.
#[derive(Default)]
struct CountSink {
    tokens: Vec<u32>,
}

impl EventSink for CountSink {
    fn send(
        &mut self,
        event: Event,
    ) -> impl std::future::Future<Output = Result<(), SinkClosed>> + Send {
        if let Event::Tokens(delta) = event {
            self.tokens.extend_from_slice(&delta.tokens);
        }
        std::future::ready(Ok(()))
    }
}

pub struct EmbeddedSuite<T: TargetModel> {
    verifier: TimedVerifier<LocalVerifier<T>>,
    drafter: Timed,
    clock: RoundClock,
    next_id: AtomicU64,
}

impl<T: TargetModel> EmbeddedSuite<T> {
    pub fn new(verifier: LocalVerifier<T>, drafter: EmbeddedDrafter) -> Self {
        let clock = RoundClock::default();
        let timed = |c: &RoundClock| c.clone();
        let drafter = match drafter {
            EmbeddedDrafter::Ngram => Timed::Ngram(TimedDrafter {
                inner: NgramDrafter::default(),
                clock: timed(&clock),
            }),
            EmbeddedDrafter::Mtp(inner) => Timed::Mtp(Box::new(TimedDrafter {
                inner: *inner,
                clock: timed(&clock),
            })),
            EmbeddedDrafter::DraftModel(inner) => Timed::DraftModel(Box::new(TimedDrafter {
                inner: *inner,
                clock: timed(&clock),
            })),
            EmbeddedDrafter::HybridMtp(inner) => Timed::HybridMtp(Box::new(TimedDrafter {
                inner: HybridDrafter::with_default_lookup(*inner),
                clock: timed(&clock),
            })),
            EmbeddedDrafter::HybridDraftModel(inner) => {
                Timed::HybridDraftModel(Box::new(TimedDrafter {
                    inner: HybridDrafter::with_default_lookup(*inner),
                    clock: timed(&clock),
                }))
            }
        };
        Self {
            verifier: TimedVerifier {
                inner: verifier,
                clock: clock.clone(),
            },
            drafter,
            clock,
            next_id: AtomicU64::new(1),
        }
    }

    /// One greedy generation of exactly `max_tokens` tokens; plain when `block_size` is None.
    pub async fn run(
        &self,
        prompt_ids: &[u32],
        max_tokens: usize,
        block_size: Option<usize>,
        eos: &[u32],
        into: &mut ModeResult,
    ) -> Result<()> {
        let block = block_size.map_or(BlockSizeConfig::PLAIN, BlockSizeConfig::fixed);
        self.run_with(prompt_ids, max_tokens, block, eos, into)
            .await
    }

    /// One greedy generation of exactly `max_tokens` tokens with the block sizes of `block`
    /// (plain when it is not speculative).
    pub async fn run_with(
        &self,
        prompt_ids: &[u32],
        max_tokens: usize,
        block: BlockSizeConfig,
        eos: &[u32],
        into: &mut ModeResult,
    ) -> Result<()> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = greedy_request(id, prompt_ids.to_vec(), max_tokens, eos.to_vec(), block);
        self.clock.take();
        let start = Instant::now();
        let sample = match (&self.drafter, block.is_speculative()) {
            (_, false) => self.drive::<NoDrafter<TargetCarry>>(None, request).await?,
            (Timed::Ngram(d), true) => self.drive(Some(d), request).await?,
            (Timed::Mtp(d), true) => self.drive(Some(d.as_ref()), request).await?,
            (Timed::DraftModel(d), true) => self.drive(Some(d.as_ref()), request).await?,
            (Timed::HybridMtp(d), true) => self.drive(Some(d.as_ref()), request).await?,
            (Timed::HybridDraftModel(d), true) => self.drive(Some(d.as_ref()), request).await?,
        };
        into.runs.push(RunSample {
            elapsed: start.elapsed(),
            ..sample
        });
        into.phases.extend(self.clock.take());
        Ok(())
    }

    async fn drive<D: Drafter<Carry = TargetCarry>>(
        &self,
        drafter: Option<&D>,
        request: GenerationRequest,
    ) -> Result<RunSample> {
        let mut sink = CountSink::default();
        let control = RequestControl::default();
        let finish = RoundLoop::new(&self.verifier, drafter, &TargetText::default())
            .run(request, &mut sink, &control)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if let Some(fallback) = &finish.stats.fallback {
            tracing::warn!(?fallback, "the drafter failed; the run went on without it");
        }
        let stats = finish.stats;
        Ok(RunSample {
            tokens: sink.tokens.len(),
            elapsed: Default::default(),
            rounds: stats.rounds,
            accepted: stats.accepted,
            output: sink.tokens,
            drafted: stats.drafted,
            drafted_at_position: stats.drafted_at_position,
            accepted_at_position: stats.accepted_at_position,
        })
    }
}

/// Greedy decoding of exactly `max_tokens` tokens (end-of-sequence ignored), as every
/// benchmark generation runs.
pub(super) fn greedy_request(
    id: u64,
    prompt_ids: Vec<u32>,
    max_tokens: usize,
    eos_token_ids: Vec<u32>,
    block_size: BlockSizeConfig,
) -> GenerationRequest {
    GenerationRequest {
        seq: SeqId(id),
        session: SessionId(id),
        prompt_ids,
        sampling: SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        },
        stop: StopConditions {
            max_tokens,
            eos_token_ids,
            ignore_eos: true,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
        },
        block_size,
        cache_scope: Default::default(),
        forced_drafts: 0,
        rules: Default::default(),
        top_logprobs: None,
    }
}
