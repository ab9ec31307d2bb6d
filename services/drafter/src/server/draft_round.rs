//! Draft: round order, carry decoding and application, drafting, replay.

use std::time::Instant;

use candle_core::Device;
use specd_wire::drafter::{draft_request, DraftRequest, DrafterKind};
use specd_wire::kv::KvDeltaTensors;
use specd_wire::tensor::{decode_checked, Dim};
use tonic::Status;

use super::open::check_ids;
use super::sessions::{SessionEntry, StepKey};
use super::status::status_of;
use crate::engine::{DraftCarry, DraftEngine, DraftStep, EngineInfo};
use crate::kv_deltas::concat_deltas;
use crate::tree_growth::Branching;
use crate::wire_kv::{committed_kv, model_hidden};
use specd_core::DraftTree;

/// Checks that need no session state: count, bonus and carry kind.
pub(crate) fn check_request(request: &DraftRequest, info: &EngineInfo) -> Result<(), Status> {
    let count = request.count as usize;
    if count == 0 || count > info.max_draft_tokens {
        return Err(Status::invalid_argument(format!(
            "count: must be in 1..={}, got {count}",
            info.max_draft_tokens
        )));
    }
    check_ids(&[request.bonus], info.vocab_size, "bonus")?;
    for (field, value) in [
        ("predraft_branches", request.predraft_branches),
        ("tree_nodes", request.tree_nodes),
    ] {
        if value as usize > info.max_draft_tokens {
            return Err(Status::invalid_argument(format!(
                "{field}: must be at most {}, got {value}",
                info.max_draft_tokens
            )));
        }
    }
    if let Some(chance) = request
        .least_branch_chance
        .filter(|chance| !(0.0..=1.0).contains(chance))
    {
        return Err(Status::invalid_argument(format!(
            "least_branch_chance: must be a probability in [0, 1], got {chance}"
        )));
    }
    if request.round == 0 {
        return Err(Status::invalid_argument("round: rounds start at 1"));
    }
    match (&request.carry, info.kind) {
        (Some(draft_request::Carry::Mtp(_)), DrafterKind::Mtp)
        | (Some(draft_request::Carry::Tokens(_)), DrafterKind::DraftModel) => Ok(()),
        (None, _) => Err(Status::invalid_argument("carry: required")),
        _ => Err(Status::invalid_argument(format!(
            "carry: this drafter is {} and takes the matching carry",
            info.kind.as_str_name()
        ))),
    }
}

/// What one Draft answers.
pub(crate) struct Drafted {
    /// A chain, or a tree where the request allowed branches.
    pub drafts: DraftTree,
    /// The drafts came from the pre-draft of the previous round.
    pub predraft_hit: bool,
    /// ... from one of its rejection branches.
    pub branch_hit: bool,
}

/// A Draft once its round's carry is applied: answered already (a retry of a drafted
/// round), or to be drafted.
pub(crate) enum Prepared {
    Answered(Drafted),
    /// To be drafted: a tree branching as `branching` allows (up to `key.tree_nodes`
    /// branch drafts), or a chain.
    Draft {
        step: DraftStep,
        key: StepKey,
        branching: Branching,
    },
}

/// Checks a Draft against its session and applies its carry. Blocking.
pub(crate) fn prepare_round<E: DraftEngine>(
    engine: &E,
    info: &EngineInfo,
    entry: &mut SessionEntry<E::Session>,
    request: &DraftRequest,
) -> Result<Prepared, Status> {
    entry.last_used = Instant::now();
    let key = StepKey {
        bonus: request.bonus,
        position: request.position,
        count: request.count,
        output_index_base: request.output_index_base,
        tree_nodes: request.tree_nodes,
    };
    let next = entry.applied_round + 1;
    if request.round == entry.applied_round {
        if let Some((stored, drafts)) = &entry.answer {
            if *stored != key {
                return Err(Status::failed_precondition(format!(
                    "round: a retry of round {} must repeat its bonus, position, count, \
                     output_index_base and tree_nodes",
                    request.round
                )));
            }
            return Ok(Prepared::Answered(Drafted {
                drafts: drafts.clone(),
                predraft_hit: false,
                branch_hit: false,
            }));
        }
        // The carry of this round was applied but drafting failed: draft again.
    } else if request.round == next {
        let carry = decode_carry(request, info, engine.device())?;
        check_continues(engine, entry, &carry)?;
        check_position(engine, entry, carry.committed_rows(), request.position)?;
        engine.apply(&mut entry.session, carry).map_err(status_of)?;
        entry.applied_round = next;
        entry.answer = None;
    } else {
        return Err(Status::failed_precondition(format!(
            "round: expected {next} (or {} to retry), got {}",
            entry.applied_round, request.round
        )));
    }
    check_position(engine, entry, 0, request.position)?;
    let step = DraftStep {
        bonus: request.bonus,
        position: request.position as usize,
        count: request.count as usize,
        output_index_base: u64::from(request.output_index_base),
        branches: request.predraft_branches as usize,
    };
    let branching = Branching::new(
        key.tree_nodes as usize,
        request.least_branch_chance.map(f64::from),
    );
    Ok(Prepared::Draft {
        step,
        key,
        branching,
    })
}

/// Records what the engine drafted for a prepared round, for retries, and answers it.
pub(crate) fn finish_round<E: DraftEngine>(
    engine: &E,
    entry: &mut SessionEntry<E::Session>,
    step: DraftStep,
    key: StepKey,
    drafted: Result<DraftTree, crate::engine::EngineError>,
) -> Result<Drafted, Status> {
    let mut drafts = drafted.map_err(status_of)?;
    let (predraft_hit, branch_hit) = (
        engine.predraft_hit(&entry.session),
        engine.predraft_branch_hit(&entry.session),
    );
    if drafts.is_chain() {
        drafts.tokens.truncate(step.count);
    } else if !drafts.fits(step.count, key.tree_nodes as usize) {
        return Err(Status::internal(format!(
            "the engine drafted {} tokens in {} levels; {} levels and {} branch drafts were asked",
            drafts.tokens.len(),
            drafts.depth(),
            step.count,
            key.tree_nodes
        )));
    }
    entry.answer = Some((key, drafts.clone()));
    Ok(Drafted {
        drafts,
        predraft_hit,
        branch_hit,
    })
}

/// An MTP delta must start where the session's rows end (a lost or repeated delta shows
/// up here).
fn check_continues<E: DraftEngine>(
    engine: &E,
    entry: &SessionEntry<E::Session>,
    carry: &DraftCarry,
) -> Result<(), Status> {
    if let DraftCarry::Mtp {
        delta: Some(delta), ..
    } = carry
    {
        let held = engine.committed_len(&entry.session);
        if delta.start_position() != held {
            return Err(Status::failed_precondition(format!(
                "carry.mtp.delta.start_position: the session holds {held} positions, the \
                 delta starts at {}",
                delta.start_position()
            )));
        }
    }
    Ok(())
}

/// `position` must be the last committed position once `rows` more are applied.
fn check_position<E: DraftEngine>(
    engine: &E,
    entry: &SessionEntry<E::Session>,
    rows: usize,
    position: u32,
) -> Result<(), Status> {
    let committed = engine.committed_len(&entry.session) + rows;
    if position as usize + 1 != committed {
        return Err(Status::failed_precondition(format!(
            "position: the session's last committed position is {}, the request says {position}",
            committed as i64 - 1
        )));
    }
    Ok(())
}

fn decode_carry(
    request: &DraftRequest,
    info: &EngineInfo,
    device: &Device,
) -> Result<DraftCarry, Status> {
    match &request.carry {
        Some(draft_request::Carry::Mtp(mtp)) => {
            let hidden = mtp
                .hidden
                .as_ref()
                .ok_or_else(|| Status::invalid_argument("carry.mtp.hidden: required"))?;
            let hidden = decode_checked(
                hidden,
                "carry.mtp.hidden",
                device,
                None,
                &[Dim::Exactly(1), Dim::Exactly(1), Dim::Any],
            )?;
            let mut fields = Vec::new();
            let mut parts = Vec::new();
            if let Some(delta) = &mtp.delta {
                fields.push("carry.mtp.delta".to_owned());
                parts.push(KvDeltaTensors::decode(delta, "carry.mtp.delta", device)?);
            } else if !mtp.later_deltas.is_empty() {
                return Err(Status::invalid_argument(
                    "carry.mtp.later_deltas: given without carry.mtp.delta",
                ));
            }
            for (i, delta) in mtp.later_deltas.iter().enumerate() {
                let field = format!("carry.mtp.later_deltas[{i}]");
                parts.push(KvDeltaTensors::decode(delta, &field, device)?);
                fields.push(field);
            }
            let delta = concat_deltas(parts, &fields)
                .map_err(Status::invalid_argument)?
                .map(|delta| committed_kv(delta).map_err(internal("carry.mtp.delta")))
                .transpose()?;
            let hidden = model_hidden(hidden).map_err(internal("carry.mtp.hidden"))?;
            Ok(DraftCarry::Mtp { hidden, delta })
        }
        Some(draft_request::Carry::Tokens(tokens)) => {
            check_ids(&tokens.committed, info.vocab_size, "carry.tokens.committed")?;
            Ok(DraftCarry::Tokens(tokens.committed.clone()))
        }
        None => Err(Status::invalid_argument("carry: required")),
    }
}

/// A tensor reshape that cannot fail on checked input failed anyway.
fn internal(field: &str) -> impl Fn(candle_core::Error) -> Status + '_ {
    move |e| Status::internal(format!("{field}: {e}"))
}
