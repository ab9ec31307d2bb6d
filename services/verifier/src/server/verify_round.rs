//! One Verify round: order and replay checks, the model round, and the wire answer.

use std::time::Instant;

use specd_core::VerifyRequest as CoreVerify;
use specd_wire::verifier::{ForwardStats, VerifyRequest, VerifyResponse};
use tonic::Status;

use super::convert::{delta_of, hidden_to_wire, position};
use super::sequences::{Replay, SeqEntry, SeqWire, Sequences};
use super::status::status_of;
use crate::carry::TargetCarry;
use crate::target::TargetModel;
use specd_core::sync::lock;

impl<T: TargetModel> Sequences<T> {
    /// Applies a round through the batch scheduler, or replays the last one to a retry. The
    /// protocol state is not locked while the round waits for its forward; a concurrent retry
    /// of the same round gets the answer the verifier stored for it, so both agree.
    pub async fn verify(&self, request: VerifyRequest) -> Result<VerifyResponse, Status> {
        let SeqEntry { seq, state: entry } = self.entry(&request.seq_id)?;
        let with_mtp_state = {
            let mut state = lock(&entry);
            state.last_used = Instant::now();
            if let Some(replay) = replay(&state, &request)? {
                return Ok(replay);
            }
            check_order(&state, &request)?;
            state.with_mtp_state
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
                tokens: request.tokens.clone(),
                budget: request.budget as usize,
                output_index_base: u64::from(request.output_index_base),
                want_carry: with_mtp_state,
            })
            .await
            .map_err(status_of)?;
        let mut state = lock(&entry);
        state.last_used = Instant::now();
        if let Some(replay) = replay(&state, &request)? {
            return Ok(replay);
        }
        check_order(&state, &request)?;
        let verified = row.verified;
        let committed_len = position(
            state.committed_len as usize + verified.accepted + 1,
            "committed_len",
        )?;
        let mut response = VerifyResponse {
            accepted: position(verified.accepted, "accepted")?,
            new_tokens: verified.new_tokens,
            committed_len,
            hidden: None,
            kv_delta: None,
            replayed: false,
            forward: verified.forward.map(forward_stats),
        };
        if state.with_mtp_state {
            let carry = verified
                .carry
                .ok_or_else(|| Status::internal("verify: the target returned no carry"))?;
            attach_mtp_state(&mut state, &carry, row.sliding_start, &mut response)?;
        }
        state.last_round = request.round;
        state.committed_len = committed_len;
        state.last_answer = Some(Replay {
            tokens: request.tokens,
            response: response.clone(),
        });
        Ok(response)
    }
}

/// Adds the hidden state at the accepted slot and the committed K/V rows, with the eviction
/// that keeps the drafter's sliding mirror equal to this verifier's window.
fn attach_mtp_state(
    state: &mut SeqWire,
    carry: &TargetCarry,
    sliding_start: Option<usize>,
    response: &mut VerifyResponse,
) -> Result<(), Status> {
    let rows = carry.shared_kv.as_ref().ok_or_else(|| {
        Status::internal("verify: the target returned no K/V rows for the drafter")
    })?;
    let sliding_start = match sliding_start {
        Some(start) => position(start, "kv_delta.sliding_start")?,
        None => 0,
    };
    let evicted = sliding_start.saturating_sub(state.mirror_sliding_start);
    let delta = delta_of(state.committed_len, rows, evicted)?;
    response.hidden = Some(hidden_to_wire(&carry.hidden, "hidden")?);
    response.kv_delta = Some(delta.encode("kv_delta")?);
    state.mirror_sliding_start = sliding_start;
    Ok(())
}

/// The stored answer when `request` retries the last applied round with the same tokens.
fn replay(state: &SeqWire, request: &VerifyRequest) -> Result<Option<VerifyResponse>, Status> {
    if request.round != state.last_round {
        return Ok(None);
    }
    match &state.last_answer {
        Some(last) if last.tokens == request.tokens => {
            let mut response = last.response.clone();
            response.replayed = true;
            response.forward = None;
            Ok(Some(response))
        }
        Some(_) => Err(Status::failed_precondition(format!(
            "tokens: a retry of round {} must send the tokens of the original request",
            request.round
        ))),
        None => Err(Status::failed_precondition(format!(
            "round: round {} was already applied or is not the next round ({})",
            request.round,
            state.last_round + 1
        ))),
    }
}

fn check_order(state: &SeqWire, request: &VerifyRequest) -> Result<(), Status> {
    let next = state.last_round + 1;
    if request.round != next {
        return Err(Status::failed_precondition(format!(
            "round: expected {next} (or {} to retry), got {}",
            state.last_round, request.round
        )));
    }
    if request.committed_len != state.committed_len {
        return Err(Status::failed_precondition(format!(
            "committed_len: the sequence holds {} tokens, the request says {}",
            state.committed_len, request.committed_len
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
