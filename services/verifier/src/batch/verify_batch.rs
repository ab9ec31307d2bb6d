//! One batched verify forward: every row's block in one pass of the target, then each row's
//! acceptance and rollback on its own.

use std::collections::HashSet;
use std::sync::MutexGuard;

use std::time::Instant;

use candle_core::Tensor;
use specd_core::{ForwardCost, SeqId};
use specd_telemetry::propagation::link_row;

use super::counters::Counters;
use super::jobs::{RowAnswer, VerifyJob};
use super::prefill_task::{Piece, PrefillTask};
use crate::error::VerifierError;
use crate::local::{tree_depths, LocalVerifier, Sequence, SequenceHandle, VerifyStart};
use crate::target::TargetModel;
use crate::verify_block::{head_tokens, HeadRows};
use specd_core::sync::lock;
use specd_models::SeqBlock;

/// Takes up to `max_rows` rows of distinct sequences, oldest first, out of `waiting`. Rows
/// whose caller went away are dropped; a second row of a sequence already taken (a retry
/// racing its original) stays for the next forward.
pub(crate) fn take_rows(
    waiting: &mut Vec<VerifyJob>,
    max_rows: usize,
    counters: &Counters,
) -> Vec<VerifyJob> {
    let mut taken = Vec::new();
    let mut seen: HashSet<SeqId> = HashSet::new();
    let mut kept = Vec::new();
    for job in waiting.drain(..) {
        if job.reply.is_closed() {
            counters.dequeued(1);
            counters.cancelled();
        } else if taken.len() < max_rows && seen.insert(job.request.seq) {
            counters.dequeued(1);
            taken.push(job);
        } else {
            kept.push(job);
        }
    }
    *waiting = kept;
    taken
}

struct Row<'a, C> {
    job: VerifyJob,
    state: MutexGuard<'a, Sequence<C>>,
    start_len: usize,
}

/// Runs the rows' blocks in one forward and answers each row. Prefill `pieces` ride along
/// in the same forward (the target must [`TargetModel::prefill_joins_blocks`]); returns the
/// prefill tasks that have pieces left, in order.
pub(crate) fn run_batch<T: TargetModel>(
    local: &LocalVerifier<T>,
    taken: Vec<VerifyJob>,
    mut pieces: Vec<(PrefillTask<T::Cache>, Piece)>,
    counters: &Counters,
) -> Vec<PrefillTask<T::Cache>> {
    let mut jobs = Vec::new();
    let mut handles: Vec<SequenceHandle<T::Cache>> = Vec::new();
    for job in taken {
        match local.sequence(job.request.seq) {
            Ok(handle) => {
                jobs.push(job);
                handles.push(handle);
            }
            Err(e) => {
                let _ = job.reply.send(Err(e));
            }
        }
    }
    // Only this thread ever holds more than one sequence lock, so locking them all in turn
    // cannot deadlock; a caller's truncate or snapshot waits for the forward to end.
    let mut rows: Vec<Row<'_, T::Cache>> = Vec::new();
    for (job, handle) in jobs.into_iter().zip(&handles) {
        if job.reply.is_closed() {
            counters.cancelled();
            continue;
        }
        let mut state = lock(handle);
        state.last_used = Instant::now();
        match local.begin_verify(&state, &job.request) {
            Ok(VerifyStart::Run { start_len }) => rows.push(Row {
                job,
                state,
                start_len,
            }),
            Ok(VerifyStart::Replay(answer)) => {
                let _ = job.reply.send(Ok(RowAnswer {
                    answer: *answer,
                    replayed: true,
                }));
            }
            Err(e) => {
                let _ = job.reply.send(Err(e));
            }
        }
    }
    if rows.is_empty() && pieces.is_empty() {
        return Vec::new();
    }
    // One span per forward, linked to every row's call: rows come from different traces.
    let batch_span = tracing::info_span!(
        "verify_batch",
        rows = rows.len(),
        prefill_pieces = pieces.len()
    );
    for row in &rows {
        link_row(&batch_span, &row.job.span);
    }
    let _entered = batch_span.enter();
    let started = Instant::now();
    let forwarded = {
        let mut blocks: Vec<SeqBlock<'_, T::Cache>> = rows
            .iter_mut()
            .map(|row| SeqBlock {
                cache: &mut row.state.cache,
                tokens: &row.job.request.tokens,
                parents: &row.job.request.parents,
            })
            .collect();
        blocks.extend(pieces.iter_mut().map(|(task, piece)| task.block(*piece)));
        local.target().forward_blocks(&mut blocks)
    };
    let tokens = rows.iter().map(|row| row.job.request.tokens.len()).sum();
    let batch_rows = rows.len();
    if batch_rows > 0 {
        counters.batch_ran(rows.len());
    }
    let mut hiddens = match forwarded {
        Ok(hiddens) if hiddens.len() == rows.len() + pieces.len() => hiddens,
        Ok(hiddens) => {
            let message = format!(
                "{} rows in, {} out",
                rows.len() + pieces.len(),
                hiddens.len()
            );
            return fail_all(local, rows, pieces, &message);
        }
        Err(e) => return fail_all(local, rows, pieces, &e.to_string()),
    };
    let piece_hiddens = hiddens.split_off(rows.len());
    if !rows.is_empty() {
        // A forward a prefill piece rode in cost more than its rows: it reports no cost, so
        // nobody learns verify costs from it.
        let cost = pieces.is_empty().then_some((tokens, started));
        answer_rows(local, rows, &hiddens, cost);
    }
    prefill_pieces_ran(local, pieces, piece_hiddens, batch_rows > 0, counters)
}

/// Each row's acceptance on its hidden states, its answer and, if its caller went away,
/// its rollback.
fn answer_rows<T: TargetModel>(
    local: &LocalVerifier<T>,
    rows: Vec<Row<'_, T::Cache>>,
    hiddens: &[Tensor],
    cost: Option<(usize, Instant)>,
) {
    let batch_rows = rows.len();
    // One LM head pass serves every row of every sequence in the forward.
    let depths: Vec<Vec<usize>> = rows
        .iter()
        .map(|row| tree_depths(&row.job.request.parents))
        .collect();
    let heads: Vec<HeadRows<'_>> = rows
        .iter()
        .zip(hiddens)
        .zip(&depths)
        .map(|((row, hidden), depths)| HeadRows {
            hidden,
            sampling: &row.state.sampling,
            output_index_base: row.job.request.output_index_base,
            depths,
            shaping: row.state.shaping(&row.job.request, row.start_len),
        })
        .collect();
    let targets = match head_tokens(&**local.target(), &heads) {
        Ok(targets) => targets,
        Err(e) => return fail_rows(local, rows, &e.to_string()),
    };
    let mut finished = Vec::with_capacity(rows.len());
    for ((mut row, hidden), targets) in rows.into_iter().zip(hiddens).zip(&targets) {
        let before = row.state.rounds.clone();
        let answer = local
            .finish_verify(
                &mut row.state,
                &row.job.request,
                hidden,
                targets,
                row.start_len,
            )
            .map(|answer| RowAnswer {
                answer,
                replayed: false,
            });
        finished.push((row, before, answer));
    }
    // Every row's acceptance on its logits is part of what the forward cost, so the answers
    // go out together, each with the whole batch's cost.
    let forward = cost.map(|(tokens, started)| ForwardCost {
        tokens,
        rows: batch_rows,
        time: started.elapsed(),
    });
    for (mut row, before, answer) in finished {
        let answer = answer.map(|mut row| {
            row.answer.verified.forward = forward;
            row
        });
        let applied = answer.is_ok();
        if row.job.reply.send(answer).is_err() && applied {
            // The caller went away during the forward and never learns the answer: undo the
            // round, so the sequence is as if it had never been sent.
            let _ = local.target().truncate(&mut row.state.cache, row.start_len);
            row.state.rounds = before;
        }
    }
}

/// Answers the prefill tasks whose pieces ran (each piece's hidden states, every row);
/// returns those with pieces left, in order.
fn prefill_pieces_ran<T: TargetModel>(
    local: &LocalVerifier<T>,
    pieces: Vec<(PrefillTask<T::Cache>, Piece)>,
    hiddens: Vec<Tensor>,
    beside_rows: bool,
    counters: &Counters,
) -> Vec<PrefillTask<T::Cache>> {
    let mut continuing = Vec::new();
    for ((task, piece), hidden) in pieces.into_iter().zip(hiddens) {
        if beside_rows {
            counters.prefill_piece_joined();
        }
        continuing.extend(task.ran_in_forward(local, counters, piece, hidden));
    }
    continuing
}

/// Fails the verify rows and the prefill pieces of a forward that failed.
fn fail_all<T: TargetModel>(
    local: &LocalVerifier<T>,
    rows: Vec<Row<'_, T::Cache>>,
    pieces: Vec<(PrefillTask<T::Cache>, Piece)>,
    why: &str,
) -> Vec<PrefillTask<T::Cache>> {
    fail_rows(local, rows, why);
    for (task, _) in pieces {
        task.fail(local, VerifierError::Forward(why.to_string()));
    }
    Vec::new()
}

/// Rolls every row back to its length before the forward and answers each with the failure.
fn fail_rows<T: TargetModel>(local: &LocalVerifier<T>, rows: Vec<Row<'_, T::Cache>>, why: &str) {
    for mut row in rows {
        let _ = local.target().truncate(&mut row.state.cache, row.start_len);
        let _ = row
            .job
            .reply
            .send(Err(VerifierError::Forward(why.to_string())));
    }
}
