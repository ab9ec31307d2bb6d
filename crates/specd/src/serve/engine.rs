//! The verifier and drafter of the one-process server, behind the router's
//! [`InProcessEngine`]: a batching verifier (verify rounds of concurrent requests share one
//! forward, prompts prefill in pieces between them, with its prefix cache) and one of the
//! embedded drafters, run by the same round loop as everywhere else.

use std::sync::Arc;

use specd_core::{Drafter, GenerationRequest, RequestControl, RoundLoop, TokenConstraint};
use specd_router::in_process::{loop_status, ChannelSink, EngineRun, EventSender};
use specd_router::{InProcessEngine, TargetLimits};
use specd_text::TargetText;
use specd_verifier::server::status_of;
use specd_verifier::{BatchVerifier, TargetCarry, TargetModel, MAX_ROLLBACK};

/// A target behind its batch scheduler, and the drafter (`None`: plain decoding).
pub struct LocalEngine<T: TargetModel, D> {
    verifier: BatchVerifier<T>,
    drafter: Option<D>,
    limits: TargetLimits,
}

impl<T: TargetModel, D> LocalEngine<T, D> {
    pub fn new(verifier: BatchVerifier<T>, drafter: Option<D>, model: String) -> Self {
        let target = verifier.local().target();
        let limits = TargetLimits {
            vocab_size: target.vocab_size(),
            max_context_tokens: target.max_context(),
            max_block_size: MAX_ROLLBACK + 1,
            model,
            verifies_trees: target.supports_trees(),
        };
        Self {
            verifier,
            drafter,
            limits,
        }
    }
}

impl<T, D> InProcessEngine for LocalEngine<T, D>
where
    T: TargetModel,
    D: Drafter<Carry = TargetCarry> + 'static,
{
    fn limits(&self) -> TargetLimits {
        self.limits.clone()
    }

    fn speculates(&self) -> bool {
        self.drafter.is_some()
    }

    fn drafter_parallelism(&self) -> usize {
        usize::from(self.drafter.is_some())
    }

    fn run(
        self: Arc<Self>,
        request: GenerationRequest,
        constraint: Option<Box<dyn TokenConstraint>>,
        text: Arc<TargetText>,
        events: EventSender,
        control: RequestControl,
    ) -> EngineRun {
        Box::pin(async move {
            let mut sink = ChannelSink(events);
            let vocab = self.limits.vocab_size;
            let result = match &self.drafter {
                Some(drafter) if request.block_size.is_speculative() => {
                    RoundLoop::new(&self.verifier, Some(drafter), &*text)
                        .with_vocab_size(vocab)
                        .run_constrained(request, constraint, &mut sink, &control)
                        .await
                }
                _ => {
                    RoundLoop::plain(&self.verifier, &*text)
                        .run_constrained(request, constraint, &mut sink, &control)
                        .await
                }
            };
            result.map_err(|error| loop_status(error, status_of))
        })
    }
}
