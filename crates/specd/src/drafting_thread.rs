//! The one-process server's drafting thread: the draft calls of concurrent requests that wait
//! at the same moment are drafted together, a draft model's in one packed forward per draft
//! step ([`draft_together`]), as the drafter service drafts its sessions and the verifier
//! batches verifies. Drafting on one thread also keeps several requests' drafter forwards
//! from competing for the same cores.

use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use specd_core::sync::lock;
use specd_core::DraftTree;
use specd_drafter::batch::{draft_together, take_distinct, BatchedRound};
use specd_drafter::{Branching, DraftEngine, DraftStep, EngineError};
use tokio::sync::oneshot;

/// The handle draft calls go through; the thread ends with the last handle.
pub(crate) struct DraftingThread<S> {
    jobs: Sender<Job<S>>,
}

/// One request's round, its carry applied.
struct Job<S> {
    session: Arc<Mutex<S>>,
    step: DraftStep,
    branching: Branching,
    reply: oneshot::Sender<Result<DraftTree, EngineError>>,
}

impl<S: Send + 'static> DraftingThread<S> {
    /// Starts the thread; `open_sessions` says how many sessions could join a batch.
    pub(crate) fn start<E: DraftEngine<Session = S>>(
        engine: Arc<E>,
        open_sessions: impl Fn() -> usize + Send + 'static,
    ) -> std::io::Result<Self> {
        let (jobs, receiver) = mpsc::channel();
        std::thread::Builder::new()
            .name("specd-drafting".into())
            .spawn(move || run(&*engine, &receiver, open_sessions))?;
        Ok(Self { jobs })
    }

    /// Drafts one round of `session`: a tree branching as `branching` allows, or a chain
    /// (no branch nodes).
    pub(crate) async fn draft(
        &self,
        session: Arc<Mutex<S>>,
        step: DraftStep,
        branching: Branching,
    ) -> Result<DraftTree, EngineError> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            session,
            step,
            branching,
            reply,
        };
        self.jobs
            .send(job)
            .map_err(|_| EngineError::Internal("the drafting thread has ended".into()))?;
        answer
            .await
            .map_err(|_| EngineError::Internal("the drafting thread dropped a draft".into()))?
    }
}

fn run<E: DraftEngine>(
    engine: &E,
    receiver: &Receiver<Job<E::Session>>,
    open_sessions: impl Fn() -> usize,
) {
    let mut waiting: VecDeque<Job<E::Session>> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            match receiver.recv() {
                Ok(job) => waiting.push_back(job),
                Err(_) => return,
            }
        }
        gather(receiver, &mut waiting, open_sessions());
        let batch: Vec<Job<E::Session>> =
            take_distinct(&mut waiting, |a, b| Arc::ptr_eq(&a.session, &b.session))
                .into_iter()
                // A request gone meanwhile (cancelled) needs no draft.
                .filter(|job| !job.reply.is_closed())
                .collect();
        let mut guards: Vec<_> = batch.iter().map(|job| lock(&job.session)).collect();
        let rounds = guards
            .iter_mut()
            .zip(&batch)
            .map(|(guard, job)| BatchedRound {
                session: &mut **guard,
                step: job.step,
                branching: job.branching,
            })
            .collect();
        let answers = draft_together(engine, rounds);
        drop(guards);
        for (job, answer) in batch.into_iter().zip(answers) {
            let _ = job.reply.send(answer);
        }
    }
}

/// Takes the jobs that arrived and, while other sessions are open, waits a moment for theirs:
/// requests verified in one batch ask for their drafts one after the other.
fn gather<S>(receiver: &Receiver<Job<S>>, waiting: &mut VecDeque<Job<S>>, open_sessions: usize) {
    let deadline = Instant::now() + GATHER;
    waiting.extend(receiver.try_iter());
    while waiting.len() < open_sessions {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        match receiver.recv_timeout(deadline - now) {
            Ok(job) => waiting.push_back(job),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// A small share of one draft step.
const GATHER: Duration = Duration::from_millis(1);
