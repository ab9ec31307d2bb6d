//! Building requests and running them to completion.

use specd_core::round_loop::RoundLoopError;
use specd_core::{
    BlockSizeConfig, Drafter, Event, Finish, GenerationRequest, RequestControl, RoundLoop,
    SamplingParams, SeqId, SessionId, StopConditions,
};

use super::executor::block_on;
use super::pieces::Pieces;
use super::table_drafter::TableDrafter;
use super::table_verifier::{Carry, TableVerifier, TableVerifierError};

pub const PROMPT: [u32; 5] = [9, 10, 1, 2, 7];
pub const SEQ: SeqId = SeqId(17);
pub const SESSION: SessionId = SessionId(23);

/// Greedy plus two seeded sampling setups.
pub fn samplings() -> [SamplingParams; 3] {
    [
        SamplingParams::GREEDY,
        SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            top_k: 12,
            seed: 7,
        },
        SamplingParams {
            temperature: 1.4,
            top_p: 1.0,
            top_k: 0,
            seed: 99,
        },
    ]
}

pub fn request(
    block_size: BlockSizeConfig,
    sampling: SamplingParams,
    stop: StopConditions,
) -> GenerationRequest {
    GenerationRequest {
        seq: SEQ,
        session: SESSION,
        prompt_ids: PROMPT.to_vec(),
        sampling,
        stop,
        block_size,
        cache_scope: Default::default(),
        rules: Default::default(),
        top_logprobs: None,
        forced_drafts: 0,
    }
}

pub type Outcome = Result<Finish, RoundLoopError<TableVerifierError>>;

/// Runs `request` to completion, collecting every event.
pub fn run(
    verifier: &TableVerifier,
    drafter: Option<&TableDrafter>,
    request: GenerationRequest,
) -> (Vec<Event>, Outcome) {
    run_with(verifier, drafter, request)
}

/// [`run`] with any drafter over the table verifier's carries.
pub fn run_with<D: Drafter<Carry = Carry>>(
    verifier: &TableVerifier,
    drafter: Option<&D>,
    request: GenerationRequest,
) -> (Vec<Event>, Outcome) {
    let mut events = Vec::new();
    let outcome = block_on(RoundLoop::new(verifier, drafter, &Pieces).run(
        request,
        &mut events,
        &RequestControl::new(),
    ));
    (events, outcome)
}

/// All emitted token ids, in order.
pub fn tokens_of(events: &[Event]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Tokens(delta) => Some(delta.tokens.clone()),
            Event::Finished(_) => None,
        })
        .flatten()
        .collect()
}

/// All text deltas, concatenated.
pub fn text_of(events: &[Event]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Tokens(delta) => Some(delta.text.as_str()),
            Event::Finished(_) => None,
        })
        .collect()
}

/// The final event, which must be the last one.
pub fn finished_event(events: &[Event]) -> Option<&Finish> {
    match events.last() {
        Some(Event::Finished(finish)) => Some(finish),
        _ => None,
    }
}
