//! A drafter engine of the drafter service run in this process (`specd generate` and the
//! one-process server): fed the verifier's carries directly instead of over gRPC, behind
//! core's [`Drafter`].

use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use specd_core::sync::lock;
use specd_core::{DraftRequest, DraftTree, Drafter, OpenRequest, Opened, SessionId};
use specd_drafter::{
    Branching, DraftCarry, DraftEngine, DraftStep, EngineError, OpenSession, SessionSource,
};
use specd_verifier::TargetCarry;

use crate::drafting_thread::DraftingThread;

/// How an engine's sessions are fed from the in-process verifier's carries.
pub trait InProcessCarry: DraftEngine {
    /// Where a session starts, and the carries to apply right after opening.
    fn open_from(
        &self,
        request: &OpenRequest<TargetCarry>,
    ) -> Result<(SessionSource, Vec<DraftCarry>), EngineError>;

    /// The carries a draft request brings, oldest first.
    fn carries_of(
        &self,
        request: &DraftRequest<TargetCarry>,
    ) -> Result<Vec<DraftCarry>, EngineError>;
}

/// A session behind its own lock.
type SharedSession<S> = Arc<Mutex<S>>;

pub struct EmbeddedDrafter<E: DraftEngine> {
    engine: Arc<E>,
    /// Each session behind its own lock: sessions draft beside each other, and the table is
    /// held only to find one.
    sessions: Arc<DashMap<SessionId, SharedSession<E::Session>>>,
    /// Where a server drafts its concurrent requests together (`None`: each on its caller).
    /// A server's opens and carries run on the calling task's worker thread, which tells the
    /// async runtime first (its multi-threaded runtime keeps serving other tasks meanwhile).
    drafting: Option<DraftingThread<E::Session>>,
}

impl<E: InProcessCarry> EmbeddedDrafter<E> {
    pub fn new(engine: E) -> Self {
        Self {
            engine: Arc::new(engine),
            sessions: Arc::new(DashMap::new()),
            drafting: None,
        }
    }

    /// For a server whose requests share a multi-threaded runtime: opens and carries run
    /// through `tokio::task::block_in_place`, and the rounds of concurrent requests are
    /// drafted together on a drafting thread.
    pub fn serving(mut self) -> std::io::Result<Self> {
        let sessions = self.sessions.clone();
        self.drafting = Some(DraftingThread::start(self.engine.clone(), move || {
            sessions.len()
        })?);
        Ok(self)
    }

    fn compute<R>(&self, work: impl FnOnce() -> R) -> R {
        if self.drafting.is_some() {
            tokio::task::block_in_place(work)
        } else {
            work()
        }
    }

    /// The engine itself (benchmarks time its model directly).
    pub fn engine(&self) -> &E {
        &self.engine
    }

    /// Ends a session; the engine keeps what it can reuse, unless a draft of the session
    /// still runs.
    fn close_now(&self, session: SessionId) {
        let Some((_, entry)) = self.sessions.remove(&session) else {
            return;
        };
        if let Ok(entry) = Arc::try_unwrap(entry) {
            self.engine
                .close(entry.into_inner().unwrap_or_else(|e| e.into_inner()));
        }
    }

    fn open_now(&self, request: OpenRequest<TargetCarry>) -> Result<Opened, EngineError> {
        let (source, first) = self.engine.open_from(&request)?;
        let mut session = self.engine.open(OpenSession {
            sampling: request.sampling,
            committed_len: request.carry.committed_len,
            source,
            cache_scope: request.cache_scope.clone(),
        })?;
        let computed = self.engine.computed_at_open(&session);
        for carry in first {
            self.engine.apply(&mut session, carry)?;
        }
        self.sessions
            .insert(request.session, Arc::new(Mutex::new(session)));
        Ok(Opened::computed(computed))
    }

    /// Applies the round's carries to its session: the session and the step to draft.
    fn prepare(
        &self,
        request: &DraftRequest<TargetCarry>,
    ) -> Result<(SharedSession<E::Session>, DraftStep), EngineError> {
        let carries = self.engine.carries_of(request)?;
        let entry = self
            .sessions
            .get(&request.session)
            .map(|entry| entry.value().clone())
            .ok_or_else(|| EngineError::mismatch("session", "not open"))?;
        let mut session = lock(&entry);
        for carry in carries {
            self.engine.apply(&mut session, carry)?;
        }
        let held = self.engine.committed_len(&session);
        if held != request.committed_len {
            return Err(EngineError::mismatch(
                "committed_len",
                format!(
                    "the session holds {held}, the round says {}",
                    request.committed_len
                ),
            ));
        }
        let step = DraftStep {
            bonus: request.bonus,
            position: held - 1,
            count: request.count,
            output_index_base: request.output_index_base,
            branches: 0,
        };
        drop(session);
        Ok((entry, step))
    }

    /// The round's drafts: a tree with up to `request.tree_nodes` branch drafts, each as
    /// likely as `request.least_branch_chance`, where the request allows one.
    async fn draft_round(
        &self,
        request: DraftRequest<TargetCarry>,
    ) -> Result<DraftTree, EngineError> {
        let (session, step) = self.compute(|| self.prepare(&request))?;
        let branching = Branching::new(request.tree_nodes, request.least_branch_chance);
        if let Some(drafting) = &self.drafting {
            return drafting.draft(session, step, branching).await;
        }
        let mut session = lock(&session);
        match branching.nodes {
            0 => self.engine.draft(&mut session, step).map(DraftTree::chain),
            _ => self.engine.draft_tree(&mut session, step, branching),
        }
    }
}

impl<E: InProcessCarry> Drafter for EmbeddedDrafter<E> {
    type Carry = TargetCarry;
    type Error = EngineError;

    async fn open(&self, request: OpenRequest<TargetCarry>) -> Result<Opened, EngineError> {
        self.compute(|| self.open_now(request))
    }

    async fn draft(&self, request: DraftRequest<TargetCarry>) -> Result<Vec<u32>, EngineError> {
        let request = DraftRequest {
            tree_nodes: 0,
            ..request
        };
        self.draft_round(request).await.map(|tree| tree.tokens)
    }

    async fn draft_tree(
        &self,
        request: DraftRequest<TargetCarry>,
    ) -> Result<DraftTree, EngineError> {
        self.draft_round(request).await
    }

    async fn close(&self, session: SessionId) -> Result<(), EngineError> {
        self.close_now(session);
        Ok(())
    }

    fn close_detached(&self, session: SessionId) {
        self.close_now(session);
    }
}
