//! Every session's drafting on one thread, batched.
//!
//! Draft calls that wait at the same moment are drafted together: each session's carry is
//! applied, then the engine runs every session's draft steps in one packed forward per
//! step ([`DraftEngine::draft_many`]), as the verifier batches verifies. Between batches the
//! thread advances every session's pre-draft by one step, again in one forward
//! ([`DraftEngine::predraft_many`]), so a Draft never waits behind a whole pre-draft, only
//! behind one of its steps. Engine threads then work on one forward at a time instead of
//! several sessions' forwards competing for the same cores.

use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, MutexGuard, Weak};

use specd_core::sync::lock;
use specd_wire::drafter::DraftRequest;
use tokio::sync::oneshot;
use tonic::Status;
use tracing::Span;

use super::draft_round::{finish_round, prepare_round, Drafted, Prepared};
use super::sessions::{SessionEntry, SharedEntry};
use crate::batch::{draft_together, take_distinct, BatchedRound};
use crate::engine::{DraftEngine, EngineInfo};

/// The handle Draft handlers send their rounds through; the thread ends with the last one.
pub(crate) struct DraftBatcher<S> {
    jobs: Sender<Job<S>>,
}

/// One Draft call.
struct Job<S> {
    entry: SharedEntry<S>,
    request: DraftRequest,
    /// The call's span: the pre-draft it starts is traced under it.
    span: Span,
    reply: oneshot::Sender<Result<Drafted, Status>>,
}

/// A session pre-drafting the round after `round`.
struct Predraft<S> {
    /// Weak: a closed session is not kept alive by its pre-draft.
    entry: Weak<std::sync::Mutex<SessionEntry<S>>>,
    round: u64,
    count: usize,
    /// Open while the pre-draft runs, beside the verify of its round.
    _span: Span,
}

impl<S: Send + 'static> DraftBatcher<S> {
    /// Starts the drafting thread of `engine`.
    pub fn start<E: DraftEngine<Session = S>>(
        engine: Arc<E>,
        info: EngineInfo,
    ) -> std::io::Result<Self> {
        let (jobs, receiver) = mpsc::channel();
        std::thread::Builder::new()
            .name("specd-drafting".into())
            .spawn(move || run(&*engine, &info, &receiver))?;
        Ok(Self { jobs })
    }

    /// Drafts one round of `entry`'s session (and starts its pre-draft when asked).
    pub async fn draft(
        &self,
        entry: SharedEntry<S>,
        request: DraftRequest,
    ) -> Result<Drafted, Status> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            entry,
            request,
            span: Span::current(),
            reply,
        };
        self.jobs
            .send(job)
            .map_err(|_| Status::unavailable("the drafter's drafting thread has ended"))?;
        answer
            .await
            .map_err(|_| Status::internal("the drafting thread dropped a draft"))?
    }
}

fn run<E: DraftEngine>(engine: &E, info: &EngineInfo, receiver: &Receiver<Job<E::Session>>) {
    let mut waiting: VecDeque<Job<E::Session>> = VecDeque::new();
    let mut predrafts: Vec<Predraft<E::Session>> = Vec::new();
    loop {
        if waiting.is_empty() && predrafts.is_empty() {
            match receiver.recv() {
                Ok(job) => waiting.push_back(job),
                Err(_) => return,
            }
        }
        waiting.extend(receiver.try_iter());
        if waiting.is_empty() {
            predraft_step(engine, &mut predrafts);
        } else {
            let batch = take_batch(&mut waiting);
            draft_batch(engine, info, batch, &mut predrafts);
        }
    }
}

/// The waiting jobs of distinct sessions, oldest first; a second call for a session (a
/// retry) waits for the next batch.
fn take_batch<S>(waiting: &mut VecDeque<Job<S>>) -> Vec<Job<S>> {
    take_distinct(waiting, |a, b| Arc::ptr_eq(&a.entry, &b.entry))
}

fn draft_batch<E: DraftEngine>(
    engine: &E,
    info: &EngineInfo,
    batch: Vec<Job<E::Session>>,
    predrafts: &mut Vec<Predraft<E::Session>>,
) {
    let entries: Vec<SharedEntry<E::Session>> = batch.iter().map(|j| j.entry.clone()).collect();
    let mut guards: Vec<MutexGuard<'_, SessionEntry<E::Session>>> =
        entries.iter().map(|entry| lock(entry)).collect();
    let mut prepared: Vec<Result<Prepared, Status>> = guards
        .iter_mut()
        .zip(&batch)
        .map(|(guard, job)| {
            job.span
                .in_scope(|| prepare_round(engine, info, guard, &job.request))
        })
        .collect();
    let rounds: Vec<BatchedRound<'_, E::Session>> = guards
        .iter_mut()
        .zip(&prepared)
        .filter_map(|(guard, prepared)| match prepared {
            Ok(Prepared::Draft {
                step, branching, ..
            }) => Some(BatchedRound {
                session: &mut guard.session,
                step: *step,
                branching: *branching,
            }),
            _ => None,
        })
        .collect();
    let mut results = draft_together(engine, rounds).into_iter();
    let mut answers = Vec::with_capacity(batch.len());
    for (guard, prepared) in guards.iter_mut().zip(prepared.drain(..)) {
        answers.push(match prepared {
            Ok(Prepared::Answered(drafted)) => Ok(drafted),
            Ok(Prepared::Draft { step, key, .. }) => {
                let result = results.next().unwrap_or_else(|| {
                    Err(crate::engine::EngineError::Internal(
                        "a round was not drafted".into(),
                    ))
                });
                finish_round(engine, guard, step, key, result)
            }
            Err(status) => Err(status),
        });
    }
    drop(guards);
    for (job, answer) in batch.into_iter().zip(answers) {
        if job.request.predraft && answer.is_ok() {
            let weak = Arc::downgrade(&job.entry);
            predrafts.retain(|p| !p.entry.ptr_eq(&weak));
            let (round, count) = (job.request.round, job.request.count as usize);
            predrafts.push(Predraft {
                entry: weak,
                round,
                count,
                _span: tracing::info_span!(parent: &job.span, "predraft", round, count),
            });
        }
        // A caller gone meanwhile (cancelled) needs no answer.
        let _ = job.reply.send(answer);
    }
}

/// Advances every live pre-draft by one step; drops those that are complete, failed, or
/// whose session has moved on (its next Draft arrived) or closed.
fn predraft_step<E: DraftEngine>(engine: &E, predrafts: &mut Vec<Predraft<E::Session>>) {
    let entries: Vec<Option<SharedEntry<E::Session>>> =
        predrafts.iter().map(|p| p.entry.upgrade()).collect();
    let mut guards: Vec<Option<MutexGuard<'_, SessionEntry<E::Session>>>> = entries
        .iter()
        .zip(predrafts.iter())
        .map(|(entry, predraft)| {
            entry
                .as_ref()
                .map(|entry| lock(entry))
                .filter(|guard| guard.applied_round == predraft.round)
        })
        .collect();
    let results = {
        let mut jobs: Vec<_> = guards
            .iter_mut()
            .zip(predrafts.iter())
            .filter_map(|(guard, predraft)| {
                guard
                    .as_mut()
                    .map(|guard| (&mut guard.session, predraft.count))
            })
            .collect();
        if jobs.is_empty() {
            Vec::new()
        } else {
            engine.predraft_many(&mut jobs)
        }
    };
    let mut results = results.into_iter();
    let going: Vec<bool> = guards
        .iter()
        .map(|guard| {
            guard.is_some()
                && match results.next() {
                    Some(Ok(more)) => more,
                    Some(Err(error)) => {
                        // The next Draft finds no usable pre-draft and drafts as usual.
                        tracing::warn!(%error, "pre-drafting failed");
                        false
                    }
                    None => false,
                }
        })
        .collect();
    drop(guards);
    let mut going = going.into_iter();
    predrafts.retain(|_| going.next().unwrap_or(false));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn entry() -> SharedEntry<()> {
        Arc::new(std::sync::Mutex::new(SessionEntry {
            session: (),
            applied_round: 0,
            answer: None,
            last_used: Instant::now(),
        }))
    }

    fn job(entry: &SharedEntry<()>, round: u64) -> Job<()> {
        Job {
            entry: entry.clone(),
            request: DraftRequest {
                round,
                ..DraftRequest::default()
            },
            span: Span::none(),
            reply: oneshot::channel().0,
        }
    }

    #[test]
    fn a_batch_holds_each_session_once_and_a_retry_waits_for_the_next() {
        let (a, b) = (entry(), entry());
        let mut waiting: VecDeque<_> = [job(&a, 1), job(&b, 1), job(&a, 1), job(&a, 2)].into();
        let first = take_batch(&mut waiting);
        assert_eq!(first.len(), 2);
        assert!(Arc::ptr_eq(&first[0].entry, &a) && Arc::ptr_eq(&first[1].entry, &b));
        let second = take_batch(&mut waiting);
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].request.round, 1, "in the order they came");
        let third = take_batch(&mut waiting);
        assert_eq!(third[0].request.round, 2);
        assert!(waiting.is_empty());
    }
}
