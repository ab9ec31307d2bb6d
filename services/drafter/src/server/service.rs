//! The gRPC handlers.

use std::sync::Arc;

use prost::Message as _;
use specd_telemetry::propagation;
use specd_telemetry::record::{self, Direction, Side};
use specd_wire::drafter::{
    CloseRequest, CloseResponse, DraftRequest, DraftResponse, Drafter, DrafterStatsRequest,
    DrafterStatsResponse, OpenRequest, OpenResponse,
};
use tonic::{Request, Response, Status, Streaming};

use super::config::DrafterServerConfig;
use super::draft_round::{check_request, draft_round};
use super::open::{receive_open, session_to_open};
use super::sessions::Sessions;
use super::status::{join_failed, status_of};
use crate::engine::{DraftEngine, EngineInfo};

/// The Drafter service of one engine.
pub struct DrafterService<E: DraftEngine> {
    engine: Arc<E>,
    info: EngineInfo,
    sessions: Arc<Sessions<E::Session>>,
    config: DrafterServerConfig,
}

impl<E: DraftEngine> DrafterService<E> {
    pub fn new(engine: Arc<E>, config: DrafterServerConfig) -> Self {
        Self {
            info: engine.info(),
            engine,
            sessions: Arc::new(Sessions::new()),
            config,
        }
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
}

#[tonic::async_trait]
impl<E: DraftEngine> Drafter for DrafterService<E> {
    async fn open(
        &self,
        request: Request<Streaming<OpenRequest>>,
    ) -> Result<Response<OpenResponse>, Status> {
        self.sessions.check_room(self.config.max_sessions)?;
        let mut stream = request.into_inner();
        let received =
            receive_open(&mut stream, &self.info, self.config.max_snapshot_bytes).await?;
        let engine = self.engine.clone();
        let info = self.info.clone();
        let session = tokio::task::spawn_blocking(move || {
            let open = session_to_open(received, &info, engine.device())?;
            engine.open(open).map_err(status_of)
        })
        .await
        .map_err(join_failed)??;
        // Inserted only here: a client gone during the engine work leaves nothing behind.
        let session_id = self.sessions.insert(session, self.config.max_sessions)?;
        Ok(Response::new(OpenResponse { session_id }))
    }

    async fn draft(
        &self,
        request: Request<DraftRequest>,
    ) -> Result<Response<DraftResponse>, Status> {
        let started = std::time::Instant::now();
        let request = request.into_inner();
        record::wire_bytes("draft", Direction::Received, request.encoded_len());
        check_request(&request, &self.info)?;
        let entry = self.sessions.get(request.session_id)?;
        let engine = self.engine.clone();
        let info = self.info.clone();
        let (round, count, predraft) = (request.round, request.count as usize, request.predraft);
        let drafting = entry.clone();
        let (drafts, predraft_hit) =
            tokio::task::spawn_blocking(move || draft_round(&*engine, &info, &drafting, request))
                .await
                .map_err(join_failed)??;
        if predraft {
            // Runs while the router verifies this round, beside its verify span.
            let span = tracing::info_span!("predraft", round, count);
            let engine = self.engine.clone();
            tokio::task::spawn_blocking(move || {
                let _entered = span.enter();
                super::draft_round::predraft(&*engine, &entry, round, count);
            });
        }
        let response = DraftResponse {
            drafts,
            predraft_hit,
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
        let closed = self.sessions.remove(request.into_inner().session_id);
        Ok(Response::new(CloseResponse { closed }))
    }

    async fn stats(
        &self,
        _request: Request<DrafterStatsRequest>,
    ) -> Result<Response<DrafterStatsResponse>, Status> {
        Ok(Response::new(DrafterStatsResponse {
            live_sessions: u32::try_from(self.sessions.len()).unwrap_or(u32::MAX),
            kind: self.info.kind.into(),
            max_draft_tokens: u32::try_from(self.info.max_draft_tokens).unwrap_or(u32::MAX),
            model: self.info.model.clone(),
            vocab_size: u32::try_from(self.info.vocab_size).unwrap_or(u32::MAX),
        }))
    }
}
