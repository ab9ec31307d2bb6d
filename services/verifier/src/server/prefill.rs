//! Prefill: validation up front, then the model run and the response stream.

use std::sync::Arc;

use specd_core::{PrefillRequest as CorePrefill, SeqId};
use specd_wire::ids::WireId;
use specd_wire::kv::snapshot_chunks;
use specd_wire::verifier::{prefill_response, PrefillHead, PrefillRequest, PrefillResponse};
use tokio::sync::mpsc;
use tonic::Status;
use tracing::debug;

use super::convert::{hidden_to_wire, position, snapshot_of};
use super::prefill_stream::SequenceHandover;
use super::sequences::Sequences;
use super::status::{join_failed, status_of};
use crate::batch::PendingPrefill;
use crate::target::TargetModel;
use specd_wire::sampling::sampling_from_wire;

/// Messages buffered between the producer and the transport; a slow reader holds the
/// producer back instead of growing memory.
const STREAM_BUFFER: usize = 4;

/// A prefill that passed validation.
pub(crate) struct PrefillPlan {
    pub core: CorePrefill,
    pub chunk_bytes: usize,
    /// Sizes the sequence's K/V reservation.
    pub max_new_tokens: usize,
}

/// A prefill admitted and queued on the scheduler.
pub(crate) struct StartedPrefill {
    seq: SeqId,
    pending: PendingPrefill,
    with_mtp_state: bool,
    committed_len: u32,
    chunk_bytes: usize,
}

/// Checks everything that needs no model run, so bad input is answered before a stream
/// starts, each error naming its field.
pub(crate) fn plan_prefill<T: TargetModel>(
    sequences: &Sequences<T>,
    request: PrefillRequest,
    default_chunk: impl Fn(u64) -> usize,
) -> Result<PrefillPlan, Status> {
    let target = sequences.local().target();
    let prompt = &request.prompt_ids;
    if prompt.is_empty() {
        return Err(Status::invalid_argument("prompt_ids: must not be empty"));
    }
    let vocab = target.vocab_size();
    if let Some(i) = prompt.iter().position(|&t| t as usize >= vocab) {
        return Err(Status::invalid_argument(format!(
            "prompt_ids[{i}]: token id {} is not below the vocabulary size {vocab}",
            prompt[i]
        )));
    }
    let sampling = sampling_from_wire(request.sampling.as_ref())?;
    let rules = specd_wire::sampling::rules_from_wire(request.rules.as_ref())?;
    let mask = if request.first_mask.is_empty() {
        None
    } else {
        Some(specd_wire::sampling::mask_from_wire(
            &request.first_mask,
            "first_mask",
        )?)
    };
    specd_wire::limits::check_cache_scope("cache_scope", &request.cache_scope)?;
    let context = target.max_context();
    if prompt.len() >= context {
        return Err(Status::out_of_range(format!(
            "prompt_ids: {} tokens leave no room in the context of {context} tokens",
            prompt.len()
        )));
    }
    if request.max_new_tokens == 0 {
        return Err(Status::invalid_argument(
            "max_new_tokens: must be at least 1",
        ));
    }
    let total = prompt.len().saturating_add(request.max_new_tokens as usize);
    if total > context {
        return Err(Status::out_of_range(format!(
            "max_new_tokens: {} prompt tokens plus {} new tokens exceed the context of \
             {context} tokens",
            prompt.len(),
            request.max_new_tokens
        )));
    }
    Ok(PrefillPlan {
        chunk_bytes: default_chunk(request.max_chunk_bytes),
        max_new_tokens: request.max_new_tokens as usize,
        core: CorePrefill {
            seq: SeqId(0),
            prompt_ids: request.prompt_ids,
            sampling,
            want_carry: request.with_mtp_state,
            cache_scope: specd_core::CacheScope(request.cache_scope),
            rules,
            top_logprobs: request.top_logprobs,
            mask,
            emitted_in_prompt: request.emitted_in_prompt as usize,
        },
    })
}

/// Admits the prefill under a fresh id and queues it; refusals (the sequence limit, the K/V
/// budget) come back at once.
pub(crate) fn start_prefill<T: TargetModel>(
    sequences: &Sequences<T>,
    mut plan: PrefillPlan,
) -> Result<StartedPrefill, Status> {
    let seq = sequences.allocate();
    plan.core.seq = seq;
    let with_mtp_state = plan.core.want_carry;
    let committed_len = position(plan.core.prompt_ids.len(), "committed_len")?;
    let pending = sequences
        .batch()
        .start_prefill(plan.core, Some(plan.max_new_tokens))
        .map_err(status_of)?;
    Ok(StartedPrefill {
        seq,
        pending,
        with_mtp_state,
        committed_len,
        chunk_bytes: plan.chunk_bytes,
    })
}

/// Builds every message of the stream (the head, then the snapshot chunks when the
/// sequence serves an MTP drafter) and makes the sequence's protocol state live. Blocking.
fn finish_prefill<T: TargetModel>(
    sequences: &Sequences<T>,
    seq: SeqId,
    prefilled: specd_core::Prefilled<crate::TargetCarry>,
    with_mtp_state: bool,
    committed_len: u32,
    chunk_bytes: usize,
) -> Result<Vec<PrefillResponse>, Status> {
    let id = WireId::random();
    let built = prefill_messages(id, prefilled, committed_len, with_mtp_state, chunk_bytes);
    match built {
        Ok(messages) => {
            sequences.insert(id, seq);
            Ok(messages)
        }
        Err(status) => {
            sequences.release(seq);
            Err(status)
        }
    }
}

fn prefill_messages(
    id: WireId,
    prefilled: specd_core::Prefilled<crate::TargetCarry>,
    committed_len: u32,
    with_mtp_state: bool,
    chunk_bytes: usize,
) -> Result<Vec<PrefillResponse>, Status> {
    let carry = match (with_mtp_state, prefilled.carry) {
        (true, None) => return Err(Status::internal("prefill: the target returned no carry")),
        (_, carry) => carry,
    };
    let mut head = PrefillHead {
        seq_id: id.to_string(),
        first_token: prefilled.first_token,
        committed_len,
        hidden: None,
        cached_tokens: u32::try_from(prefilled.cached_tokens).unwrap_or(u32::MAX),
        first_logprob: prefilled
            .first_logprob
            .as_ref()
            .map(specd_wire::sampling::logprob_to_wire),
    };
    let mut messages = Vec::new();
    if let Some(carry) = carry.filter(|_| with_mtp_state) {
        head.hidden = Some(hidden_to_wire(&carry.hidden, "head.hidden")?);
        let shared = carry.shared_kv.as_ref().ok_or_else(|| {
            Status::failed_precondition(
                "with_mtp_state: this target exports no shared K/V for an MTP drafter",
            )
        })?;
        let snapshot = snapshot_of(committed_len, shared)?;
        for chunk in snapshot_chunks(&snapshot, chunk_bytes)? {
            messages.push(PrefillResponse {
                body: Some(prefill_response::Body::Snapshot(chunk)),
            });
        }
    }
    messages.insert(
        0,
        PrefillResponse {
            body: Some(prefill_response::Body::Head(head)),
        },
    );
    Ok(messages)
}

/// Awaits the prefill and feeds the stream. Spawned, so it finishes (and cleans up) even
/// when the client is gone; a message that cannot be delivered releases the sequence.
pub(crate) async fn produce<T: TargetModel>(
    sequences: Arc<Sequences<T>>,
    started: StartedPrefill,
    sender: mpsc::Sender<PrefillItem>,
    handover: Arc<SequenceHandover>,
) {
    let StartedPrefill {
        seq,
        pending,
        with_mtp_state,
        committed_len,
        chunk_bytes,
    } = started;
    let outcome = match pending.await.map_err(status_of) {
        Ok(prefilled) => {
            let blocking = sequences.clone();
            tokio::task::spawn_blocking(move || {
                finish_prefill(
                    &blocking,
                    seq,
                    prefilled,
                    with_mtp_state,
                    committed_len,
                    chunk_bytes,
                )
            })
            .await
            .map_err(join_failed)
            .and_then(|result| result)
        }
        Err(status) => Err(status),
    };
    let messages = match outcome {
        Ok(messages) => messages,
        Err(status) => {
            let _ = sender.send(Err(status)).await;
            return;
        }
    };
    handover.adopt(seq);
    for message in messages {
        if sender.send(Ok(message)).await.is_err() {
            debug!(%seq, "prefill client went away");
            handover.abandon();
            return;
        }
    }
}

/// One message of the Prefill stream, or the error that ends it.
pub(crate) type PrefillItem = Result<PrefillResponse, Status>;

/// The channel a prefill stream reads from.
pub(crate) fn stream_channel() -> (mpsc::Sender<PrefillItem>, mpsc::Receiver<PrefillItem>) {
    mpsc::channel(STREAM_BUFFER)
}
