//! The gRPC handlers.

use std::sync::Arc;

use prost::Message as _;
use specd_telemetry::propagation;
use specd_telemetry::record::{self, Direction, Side};
use specd_wire::drafter::{
    CloseRequest, CloseResponse, DraftRequest, DraftResponse, Drafter, DrafterStatsRequest,
    DrafterStatsResponse, OpenRequest, OpenResponse,
};
use specd_wire::ids::WireId;
use specd_wire::placement::Placement;
use tokio::sync::Semaphore;
use tonic::{Request, Response, Status, Streaming};

use super::batcher::DraftBatcher;
use super::config::DrafterServerConfig;
use super::draft_round::check_request;
use super::open::{receive_open, session_to_open};
use super::sessions::Sessions;
use super::status::{join_failed, status_of};
use crate::engine::{DraftEngine, EngineInfo};

/// The Drafter service of one engine.
pub struct DrafterService<E: DraftEngine> {
    engine: Arc<E>,
    info: EngineInfo,
    sessions: Arc<Sessions<E::Session>>,
    /// The thread every session's drafts and pre-drafts run on, batched.
    batcher: DraftBatcher<E::Session>,
    /// Places for Opens in progress.
    opening: Arc<Semaphore>,
    config: DrafterServerConfig,
}

impl<E: DraftEngine> DrafterService<E> {
    /// The service of `engine`; fails only when its drafting thread cannot be started.
    pub fn new(engine: Arc<E>, config: DrafterServerConfig) -> std::io::Result<Self> {
        let info = engine.info();
        Ok(Self {
            batcher: DraftBatcher::start(engine.clone(), info.clone())?,
            info,
            engine,
            sessions: Arc::new(Sessions::new()),
            opening: Arc::new(Semaphore::new(config.max_concurrent_opens.max(1))),
            config,
        })
    }

    pub fn config(&self) -> &DrafterServerConfig {
        &self.config
    }

    /// Open sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    pub(crate) fn sessions(&self) -> &Arc<Sessions<E::Session>> {
        &self.sessions
    }

    /// Reads an Open stream and builds its session.
    async fn open_session(
        &self,
        mut stream: Streaming<OpenRequest>,
    ) -> Result<(E::Session, OpenedSession), Status> {
        let received =
            receive_open(&mut stream, &self.info, self.config.max_snapshot_bytes).await?;
        let engine = self.engine.clone();
        let info = self.info.clone();
        let budget = self.config.max_kv_tokens;
        tokio::task::spawn_blocking(move || {
            let open = session_to_open(received, &info, engine.device())?;
            if let Some(budget) = budget.filter(|&budget| open.committed_len > budget) {
                return Err(Status::resource_exhausted(format!(
                    "max_kv_tokens: a session of {} positions exceeds the drafter's K/V \
                     budget of {budget}",
                    open.committed_len
                )));
            }
            let session = engine.open(open).map_err(status_of)?;
            let tokens = engine.committed_len(&session);
            let computed = engine.computed_at_open(&session);
            Ok((session, OpenedSession { tokens, computed }))
        })
        .await
        .map_err(join_failed)?
    }
}

/// A session just built: the K/V positions it holds, and those its open computed or
/// received.
struct OpenedSession {
    tokens: usize,
    computed: usize,
}

#[tonic::async_trait]
impl<E: DraftEngine> Drafter for DrafterService<E> {
    async fn open(
        &self,
        request: Request<Streaming<OpenRequest>>,
    ) -> Result<Response<OpenResponse>, Status> {
        self.sessions.check_room(self.config.max_sessions)?;
        let _opening = self.opening.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "max_concurrent_opens: the drafter already opens {} sessions",
                self.config.max_concurrent_opens
            ))
        })?;
        let timeout = self.config.open_timeout;
        let opened = tokio::time::timeout(timeout, self.open_session(request.into_inner())).await;
        let (session, opened) = opened.map_err(|_| {
            Status::deadline_exceeded(format!(
                "open: the session was not ready within {} s (--open-timeout-secs)",
                timeout.as_secs()
            ))
        })??;
        // Inserted only here: a client gone during the engine work leaves nothing behind.
        let session_id = self.sessions.insert(
            session,
            self.config.max_sessions,
            opened.tokens,
            self.config.max_kv_tokens,
        )?;
        Ok(Response::new(OpenResponse {
            session_id: session_id.to_string(),
            computed_positions: Some(u32::try_from(opened.computed).unwrap_or(u32::MAX)),
        }))
    }

    async fn draft(
        &self,
        request: Request<DraftRequest>,
    ) -> Result<Response<DraftResponse>, Status> {
        let started = std::time::Instant::now();
        let mut request = request.into_inner();
        record::wire_bytes("draft", Direction::Received, request.encoded_len());
        check_request(&request, &self.info)?;
        let (id, entry) = self.sessions.get(&request.session_id)?;
        // The session's committed tokens, then the drafts of this round; a pre-draft's
        // rejection branches each hold a copy.
        let tokens =
            request.position as usize + 1 + request.count as usize + request.tree_nodes as usize;
        let budget = self.config.max_kv_tokens;
        // A tree round's next bonus could follow any of its branches: it is not pre-drafted.
        if request.tree_nodes > 0 {
            request.predraft = false;
        }
        if !request.predraft {
            request.predraft_branches = 0;
        }
        let branched = tokens * (1 + request.predraft_branches as usize);
        if request.predraft_branches > 0 && self.sessions.hold(id, branched, budget).is_err() {
            // Branches only save time: without room for their copies, pre-draft without them.
            request.predraft_branches = 0;
        }
        if request.predraft_branches == 0 {
            self.sessions.hold(id, tokens, budget)?;
        }
        // Drafted with every other session drafting now; a pre-draft, when asked, runs
        // while the router verifies this round.
        let drafted = self.batcher.draft(entry, request).await?;
        let response = DraftResponse {
            drafts: drafted.drafts.tokens,
            predraft_hit: drafted.predraft_hit,
            predraft_branch_hit: drafted.branch_hit,
            parents: drafted.drafts.parents,
        };
        propagation::set_current_attribute("drafted", response.drafts.len() as i64);
        record::wire_bytes("draft", Direction::Sent, response.encoded_len());
        record::draft_duration(Side::Server, started.elapsed());
        Ok(Response::new(response))
    }

    async fn close(
        &self,
        request: Request<CloseRequest>,
    ) -> Result<Response<CloseResponse>, Status> {
        let id = WireId::parse("session_id", &request.into_inner().session_id)?;
        let Some(entry) = self.sessions.take(id) else {
            return Ok(Response::new(CloseResponse { closed: false }));
        };
        // A draft of the session still running keeps it; otherwise the engine keeps what a
        // later session can reuse (a draft model's cache), off the async runtime.
        if let Ok(entry) = Arc::try_unwrap(entry) {
            let engine = self.engine.clone();
            tokio::task::spawn_blocking(move || {
                let entry = entry.into_inner().unwrap_or_else(|e| e.into_inner());
                engine.close(entry.session);
                if let Some(view) = engine.prefix_cache() {
                    record::prefix_cache("drafter", view.bytes, view.totals);
                }
            });
        }
        Ok(Response::new(CloseResponse { closed: true }))
    }

    async fn stats(
        &self,
        _request: Request<DrafterStatsRequest>,
    ) -> Result<Response<DrafterStatsResponse>, Status> {
        let prefixes = self.engine.prefix_cache().unwrap_or_default();
        Ok(Response::new(DrafterStatsResponse {
            live_sessions: u32::try_from(self.sessions.len()).unwrap_or(u32::MAX),
            kind: self.info.kind.into(),
            max_draft_tokens: u32::try_from(self.info.max_draft_tokens).unwrap_or(u32::MAX),
            model: self.info.model.clone(),
            vocab_size: u32::try_from(self.info.vocab_size).unwrap_or(u32::MAX),
            prefix_cache_bytes: prefixes.bytes as u64,
            prefix_cache_capacity_bytes: prefixes.capacity_bytes as u64,
            prefix_cache_hit_tokens: prefixes.totals.hit_tokens,
            prefix_cache_lookups: prefixes.totals.lookups,
            placement: Some(Placement::of_this_process()),
        }))
    }
}
