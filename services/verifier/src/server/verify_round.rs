//! One Verify round: order and replay checks, the model round, and the wire answer.

use std::time::Instant;

use specd_core::VerifyRequest as CoreVerify;
use specd_wire::verifier::{ForwardStats, VerifyRequest, VerifyResponse};
use tonic::Status;

use super::convert::{delta_of, hidden_to_wire, position};
use super::sequences::Sequences;
use super::status::status_of;
use crate::local::{RoundAnswer, RoundLog};
use crate::target::TargetModel;
use specd_core::sync::lock;

impl<T: TargetModel> Sequences<T> {
    /// Applies a round through the batch scheduler, or replays the last one to a retry. The
    /// record is not locked while the round waits for its forward; the scheduler checks it
    /// again under its lock, so a concurrent retry of the same round gets the answer stored
    /// for it and both agree.
    pub async fn verify(&self, request: VerifyRequest) -> Result<VerifyResponse, Status> {
        let (seq, record) = self.entry(&request.seq_id)?;
        let wants_carry = {
            let mut record = lock(&record);
            record.last_used = Instant::now();
            if let Some(last) = replayable(&record.rounds, &request)? {
                return response_of(last, true, record.wants_carry);
            }
            let held = self.local().len_of(&record);
            check_order(&record.rounds, held, &request)?;
            record.wants_carry
        };
        if request.tokens.is_empty() {
            return Err(Status::invalid_argument(
                "tokens: must hold at least the bonus token",
            ));
        }
        if request.budget == 0 {
            return Err(Status::invalid_argument("budget: must be at least 1"));
        }
        let row = self
            .batch()
            .verify_row(CoreVerify {
                seq,
                round: u32::try_from(request.round).map_err(|_| {
                    Status::out_of_range(format!("round: {} exceeds 32 bits", request.round))
                })?,
                tokens: request.tokens,
                parents: request.parents,
                budget: request.budget as usize,
                output_index_base: u64::from(request.output_index_base),
                want_carry: wants_carry,
                masks: request
                    .masks
                    .iter()
                    .enumerate()
                    .map(|(i, bytes)| {
                        specd_wire::sampling::mask_from_wire(bytes, &format!("masks[{i}]"))
                    })
                    .collect::<Result<_, _>>()?,
            })
            .await
            .map_err(status_of)?;
        response_of(&row.answer, row.replayed, wants_carry)
    }
}

/// The round's answer on the wire, with the hidden state at the accepted slot and the
/// committed K/V rows when the sequence serves an MTP drafter.
fn response_of(
    answer: &RoundAnswer,
    replayed: bool,
    with_mtp_state: bool,
) -> Result<VerifyResponse, Status> {
    let verified = &answer.verified;
    let mut response = VerifyResponse {
        accepted: position(verified.accepted, "accepted")?,
        new_tokens: verified.new_tokens.clone(),
        committed_len: position(answer.committed_len(), "committed_len")?,
        hidden: None,
        kv_delta: None,
        replayed,
        forward: verified.forward.filter(|_| !replayed).map(forward_stats),
        logprobs: verified
            .logprobs
            .iter()
            .map(specd_wire::sampling::logprob_to_wire)
            .collect(),
    };
    if with_mtp_state {
        let carry = verified
            .carry
            .as_ref()
            .ok_or_else(|| Status::internal("verify: the target returned no carry"))?;
        let rows = carry.shared_kv.as_ref().ok_or_else(|| {
            Status::internal("verify: the target returned no K/V rows for the drafter")
        })?;
        let evicted = position(answer.sliding_evicted, "kv_delta.sliding_evicted")?;
        let delta = delta_of(position(answer.start_len, "kv_delta.start")?, rows, evicted)?;
        response.hidden = Some(hidden_to_wire(&carry.hidden, "hidden")?);
        response.kv_delta = Some(delta.encode("kv_delta")?);
    }
    Ok(response)
}

/// The stored answer when `request` retries the last applied round with the same tokens.
fn replayable<'a>(
    rounds: &'a RoundLog,
    request: &VerifyRequest,
) -> Result<Option<&'a RoundAnswer>, Status> {
    if request.round != rounds.applied {
        return Ok(None);
    }
    match &rounds.last {
        Some(last) if last.tokens == request.tokens && last.parents == request.parents => {
            Ok(Some(last))
        }
        Some(_) => Err(Status::failed_precondition(format!(
            "tokens: a retry of round {} must send the tokens (and parents) of the original \
             request",
            request.round
        ))),
        None => Err(Status::failed_precondition(format!(
            "round: round {} was already applied or is not the next round ({})",
            request.round,
            rounds.applied + 1
        ))),
    }
}

fn check_order(rounds: &RoundLog, held: usize, request: &VerifyRequest) -> Result<(), Status> {
    let next = rounds.applied + 1;
    if request.round != next {
        return Err(Status::failed_precondition(format!(
            "round: expected {next} (or {} to retry), got {}",
            rounds.applied, request.round
        )));
    }
    if request.committed_len as usize != held {
        return Err(Status::failed_precondition(format!(
            "committed_len: the sequence holds {held} tokens, the request says {}",
            request.committed_len
        )));
    }
    Ok(())
}

fn forward_stats(forward: specd_core::ForwardCost) -> ForwardStats {
    ForwardStats {
        tokens: u32::try_from(forward.tokens).unwrap_or(u32::MAX),
        rows: u32::try_from(forward.rows).unwrap_or(u32::MAX),
        micros: u64::try_from(forward.time.as_micros()).unwrap_or(u64::MAX),
    }
}
