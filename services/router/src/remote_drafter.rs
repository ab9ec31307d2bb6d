//! The drafter side of one request, over gRPC, with failover between the pool's drafters.
//!
//! A session sticks to one drafter. When that drafter fails (connection lost, UNAVAILABLE,
//! DEADLINE_EXCEEDED, or NOT_FOUND because it restarted), the session is opened again on
//! another drafter of the same kind and the round is drafted there: an MTP drafter starts
//! from a fresh verifier snapshot, a draft-model drafter from the committed context. Only
//! when no drafter is left does the error reach the round loop, which then decodes plainly.
//! Drafts never change the output, so neither does a failover.

use specd_core::sync::lock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use specd_core::{
    DraftRequest, DraftTree, Drafter, OpenRequest, Opened, SamplingParams, SessionId,
};
use specd_wire::drafter::{
    open_request, CloseRequest, DraftRequest as WireDraft, DrafterClient, DrafterKind, OpenHeader,
    OpenRequest as WireOpen, OpenResponse,
};
use specd_wire::SnapshotChunk;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic::Code;
use tracing::{debug, info, warn, Instrument};

use crate::carry::WireCarry;
use crate::client_telemetry;
use crate::deadline::with_deadline;
use crate::drafters::{DrafterPool, Lease};
use crate::error::RemoteError;
use crate::overlap::RoundCost;
use crate::predraft::Predrafting;
use crate::remote_verifier::RemoteSequence;
use crate::sampling::sampling_to_wire;
use crate::session_resume::SessionResume;
use specd_telemetry::propagation::traced;

#[derive(Clone)]
struct SessionState {
    /// The drafter the session lives on.
    lease: Option<Arc<Lease>>,
    /// The drafter's id of the open session.
    session_id: Option<String>,
    /// Draft calls answered so far; the drafter's round numbers count these.
    rounds: u64,
    /// What the session carries between rounds, by drafter kind.
    resume: SessionResume,
    sampling: Option<SamplingParams>,
    /// The request's prefix-cache scope, which every drafter it opens on learns.
    cache_scope: String,
    /// The last Draft asked the drafter to pre-draft this round.
    predrafting: bool,
    /// Overlap was on for the last Draft (it pre-drafted unless its round was a tree).
    overlap_on: bool,
    /// The last Draft's answer, whose round the next call measures.
    last_answer: Option<DraftAnswer>,
}

/// When a draft call answered, for the round it started.
#[derive(Clone)]
struct DraftAnswer {
    at: Instant,
    /// The drafter that answered.
    url: String,
    /// Tokens the round verifies: the drafts and the bonus.
    rows: usize,
    /// Whether the drafter pre-drafts beside that round's verify.
    predrafting: bool,
}

/// Sessions opened by spawned Open calls that the request has not taken over yet, and
/// whether the request has ended; shared with those calls, so that a session opened as the
/// request goes away is closed by whichever side learns of it last.
#[derive(Default)]
struct Opening {
    ended: bool,
    unclaimed: Vec<(DrafterClient<Channel>, String)>,
}

/// One request's session on the drafter pool, as core's [`Drafter`].
pub struct RemoteSession<'a> {
    pool: Arc<DrafterPool>,
    kind: DrafterKind,
    /// The request's verifier sequence, whose snapshot re-opens an MTP session elsewhere.
    verifier: &'a RemoteSequence,
    deadline: Option<Instant>,
    /// Sessions re-opened on another drafter, reported in the request's stats.
    resyncs: Arc<AtomicU32>,
    /// Pre-drafting (overlap) on: the branches asked for, and the request's count of its
    /// hits and misses.
    predraft: Option<Predrafting>,
    state: Mutex<SessionState>,
    opening: Arc<Mutex<Opening>>,
}

/// What one Draft call answered: the drafts, whether they came from the drafter's
/// pre-draft, and whether from one of its rejection branches.
struct Answer {
    drafts: DraftTree,
    predraft_hit: bool,
    branch_hit: bool,
}

/// A failed drafter call, and whether the drafter itself should be avoided for a while.
struct CallFailure {
    error: RemoteError,
    avoid_endpoint: bool,
    resync: bool,
}

impl<'a> RemoteSession<'a> {
    /// A session that starts on `lease`'s drafter and may move to any drafter of the same
    /// kind in `pool`.
    pub fn new(
        pool: Arc<DrafterPool>,
        lease: Lease,
        verifier: &'a RemoteSequence,
        deadline: Option<Instant>,
        resyncs: Arc<AtomicU32>,
        predraft: Option<Predrafting>,
    ) -> Self {
        let kind = lease.info().kind;
        let resume = SessionResume::of(kind);
        let predraft = predraft.filter(|_| resume.predrafts());
        Self {
            pool,
            kind,
            verifier,
            deadline,
            resyncs,
            predraft,
            state: Mutex::new(SessionState {
                lease: Some(Arc::new(lease)),
                session_id: None,
                rounds: 0,
                resume,
                sampling: None,
                cache_scope: String::new(),
                predrafting: false,
                overlap_on: false,
                last_answer: None,
            }),
            opening: Arc::default(),
        }
    }

    /// Marks the request ended, so that an open still in flight closes its session when it
    /// answers; returns the sessions opened but not yet claimed, to be closed now.
    fn end_opening(&self) -> Vec<(DrafterClient<Channel>, String)> {
        let mut opening = lock(&self.opening);
        opening.ended = true;
        std::mem::take(&mut opening.unclaimed)
    }

    /// The request takes over an opened session (it is then closed through `state`).
    fn claim(&self, session_id: &str) {
        lock(&self.opening)
            .unclaimed
            .retain(|(_, id)| id != session_id);
    }

    fn state(&self) -> MutexGuard<'_, SessionState> {
        lock(&self.state)
    }

    /// What an Open of a session at `committed_len` sends.
    fn open_messages(
        &self,
        sampling: &SamplingParams,
        committed_len: usize,
        resume: &SessionResume,
        snapshot: Vec<SnapshotChunk>,
    ) -> Result<Vec<WireOpen>, RemoteError> {
        let committed_len = u32::try_from(committed_len)
            .map_err(|_| RemoteError::protocol("router", "committed length exceeds 32 bits"))?;
        let header = OpenHeader {
            sampling: Some(sampling_to_wire(sampling)),
            committed_len,
            context_ids: resume.context_ids(),
            cache_scope: self.state().cache_scope.clone(),
        };
        let mut messages = vec![WireOpen {
            body: Some(open_request::Body::Header(header)),
        }];
        messages.extend(snapshot.into_iter().map(|chunk| WireOpen {
            body: Some(open_request::Body::Snapshot(chunk)),
        }));
        Ok(messages)
    }

    /// Opens a session on `lease`'s drafter. The call completes in its own task, which
    /// records the session as unclaimed until the request [claims](Self::claim) it, or
    /// closes it when the request has already ended.
    async fn open_on(
        &self,
        lease: &Lease,
        messages: Vec<WireOpen>,
    ) -> Result<OpenResponse, CallFailure> {
        let (sender, receiver) = oneshot::channel();
        let client = lease.client();
        let deadline = self.deadline;
        let opening = self.opening.clone();
        crate::detached::spawn(
            async move {
                let outcome = open_call(client.clone(), messages, deadline).await;
                if let Ok(opened) = &outcome {
                    let session_id = &opened.session_id;
                    let ended = {
                        let mut opening = lock(&opening);
                        if !opening.ended {
                            opening.unclaimed.push((client.clone(), session_id.clone()));
                        }
                        opening.ended
                    };
                    if ended {
                        close_call(client, session_id.clone()).await;
                        return;
                    }
                }
                let _ = sender.send(outcome);
            }
            .instrument(tracing::Span::current()),
        );
        match receiver.await {
            Ok(Ok(opened)) => Ok(opened),
            Ok(Err(status)) => Err(self.failure(status)),
            Err(_) => Err(CallFailure {
                error: RemoteError::protocol("drafter", "open task ended early"),
                avoid_endpoint: false,
                resync: false,
            }),
        }
    }

    fn failure(&self, status: tonic::Status) -> CallFailure {
        let expired = self.deadline.is_some_and(|d| Instant::now() >= d);
        let code = status.code();
        CallFailure {
            avoid_endpoint: !expired && endpoint_failed(code),
            resync: !expired && code != Code::InvalidArgument,
            error: RemoteError::drafter(status),
        }
    }

    /// One Draft call on the open session.
    async fn draft_on(&self, lease: &Lease, wire: WireDraft) -> Result<Answer, CallFailure> {
        let span = client_telemetry::draft_span(&wire);
        let started = Instant::now();
        let request_bytes = prost::Message::encoded_len(&wire);
        let request = span
            .in_scope(|| with_deadline(wire, self.deadline))
            .map_err(|s| self.failure(s))?;
        match lease.client().draft(request).instrument(span.clone()).await {
            Ok(response) => {
                let response = response.into_inner();
                let response_bytes = prost::Message::encoded_len(&response);
                client_telemetry::drafted(
                    &span,
                    request_bytes,
                    response_bytes,
                    response.drafts.len(),
                    started,
                );
                Ok(Answer {
                    predraft_hit: response.predraft_hit,
                    branch_hit: response.predraft_hit && response.predraft_branch_hit,
                    drafts: DraftTree {
                        tokens: response.drafts,
                        parents: response.parents,
                    },
                })
            }
            Err(status) => Err(self.failure(status)),
        }
    }

    /// Re-opens the session on another drafter at `committed_len` and drafts round 1
    /// there. Tries every usable drafter of this kind; the error of the last try when none
    /// is left.
    async fn resync(
        &self,
        mut tried: Vec<String>,
        mut last: RemoteError,
        wire: WireDraft,
        committed_len: usize,
        resume: SessionResume,
    ) -> Result<DraftTree, RemoteError> {
        let sampling = self
            .state()
            .sampling
            .ok_or_else(|| RemoteError::protocol("drafter", "no session was opened"))?;
        let mut snapshot: Option<Vec<SnapshotChunk>> = None;
        loop {
            let Some(lease) = self.pool.pick(Some(self.kind), &tried).await else {
                return Err(last);
            };
            tried.push(lease.url().to_owned());
            if resume.needs_snapshot() && snapshot.is_none() {
                snapshot = Some(self.verifier.snapshot().await?);
            }
            let messages = self.open_messages(
                &sampling,
                committed_len,
                &resume,
                snapshot.clone().unwrap_or_default(),
            )?;
            let session_id = match self.open_on(&lease, messages).await {
                Ok(opened) => opened.session_id,
                Err(failure) => {
                    last = self.note_failure(&lease, failure)?;
                    continue;
                }
            };
            let carry = resume.first_carry();
            let max = u32::try_from(lease.info().max_draft_tokens).unwrap_or(u32::MAX);
            let first = WireDraft {
                session_id: session_id.clone(),
                round: 1,
                count: wire.count.min(max),
                carry: Some(carry),
                ..wire.clone()
            };
            let predrafting = first.predraft;
            let overlap_on = self.state().overlap_on;
            match self.draft_on(&lease, first).await {
                Ok(Answer { drafts, .. }) => {
                    self.claim(&session_id);
                    info!(url = lease.url(), %session_id, "drafter session resynced");
                    self.resyncs.fetch_add(1, Ordering::Relaxed);
                    specd_telemetry::record::fallback("failover");
                    let mut state = self.state();
                    let cache_scope = std::mem::take(&mut state.cache_scope);
                    *state = SessionState {
                        lease: Some(Arc::new(lease)),
                        session_id: Some(session_id),
                        rounds: 1,
                        resume,
                        sampling: Some(sampling),
                        cache_scope,
                        predrafting,
                        overlap_on,
                        last_answer: None,
                    };
                    return Ok(drafts);
                }
                Err(failure) => {
                    self.claim(&session_id);
                    crate::detached::spawn(close_call(lease.client(), session_id));
                    last = self.note_failure(&lease, failure)?;
                }
            }
        }
    }

    /// One round's drafts: a tree with up to `request.tree_nodes` branch drafts (a tree round
    /// is not pre-drafted), a chain without.
    async fn draft_round(
        &self,
        request: DraftRequest<WireCarry>,
    ) -> Result<DraftTree, RemoteError> {
        let state = self.state().clone();
        let (Some(lease), Some(session_id)) = (state.lease.clone(), state.session_id) else {
            return Err(RemoteError::protocol("drafter", "no session is open"));
        };
        let position = request
            .committed_len
            .checked_sub(1)
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| RemoteError::protocol("router", "invalid committed length"))?;
        let committed_len = request.committed_len;
        // A call right after one verify measures that round; one after several (plain
        // rounds between) does not.
        let one_round = request.carries.len() == 1;
        let wire_round = state.rounds + 1;
        let max_drafts = u32::try_from(lease.info().max_draft_tokens).unwrap_or(u32::MAX);
        let tree_nodes = u32::try_from(request.tree_nodes)
            .unwrap_or(u32::MAX)
            .min(max_drafts);
        let overlap_on = self.predraft.as_ref().is_some_and(|p| {
            p.overlap
                .predraft(lease.url(), || p.shares_cores(lease.placement().as_ref()))
        });
        // A tree round's next bonus could follow any branch: it is not pre-drafted.
        let predraft = overlap_on && tree_nodes == 0;
        let (carry, resume) = state
            .resume
            .advance(request.carries, request.committed_tokens)?;
        let wire = WireDraft {
            session_id: session_id.clone(),
            round: wire_round,
            bonus: request.bonus,
            position,
            count: u32::try_from(request.count).unwrap_or(u32::MAX),
            output_index_base: u32::try_from(request.output_index_base)
                .map_err(|_| RemoteError::protocol("router", "output index exceeds 32 bits"))?,
            carry: Some(carry),
            predraft,
            predraft_branches: match &self.predraft {
                Some(p) if predraft => p.branches.min(max_drafts),
                _ => 0,
            },
            tree_nodes,
            // Rows priced only where the round may branch; the drafter keeps its own
            // otherwise.
            least_branch_chance: request
                .least_branch_chance
                .filter(|_| tree_nodes > 0)
                .map(|chance| chance as f32),
        };
        let started = Instant::now();
        match self.draft_on(&lease, wire.clone()).await {
            Ok(Answer {
                drafts,
                predraft_hit: hit,
                branch_hit,
            }) => {
                let answered = Instant::now();
                if let Some(predrafting) = &self.predraft {
                    if state.predrafting {
                        predrafting.counts.record(hit, branch_hit);
                    }
                    // Overlap decisions and probes switch, not a tree round between chains.
                    if state.rounds > 0 && state.overlap_on != overlap_on {
                        predrafting.counts.switched();
                    }
                    if let Some(last) = state
                        .last_answer
                        .filter(|l| one_round && l.url == lease.url())
                    {
                        predrafting.overlap.record(
                            lease.url(),
                            RoundCost {
                                predrafted: last.predrafting,
                                rows: last.rows,
                                verify: started.saturating_duration_since(last.at),
                                draft: answered.saturating_duration_since(started),
                            },
                        );
                    }
                }
                let mut live = self.state();
                live.rounds = wire_round;
                live.resume = resume;
                live.predrafting = predraft;
                live.overlap_on = overlap_on;
                live.last_answer = Some(DraftAnswer {
                    at: answered,
                    url: lease.url().to_owned(),
                    rows: drafts.tokens.len() + 1,
                    predrafting: predraft,
                });
                Ok(drafts)
            }
            Err(failure) => {
                if failure.error.code() != Some(Code::NotFound) {
                    crate::detached::spawn(close_call(lease.client(), session_id));
                }
                {
                    // The session is gone either way; a resync starts a new one (with this
                    // round's overlap decision).
                    let mut live = self.state();
                    live.lease = None;
                    live.session_id = None;
                    live.overlap_on = overlap_on;
                }
                let avoid = failure.avoid_endpoint;
                let last = self.note_failure(&lease, failure)?;
                resume.check(committed_len)?;
                let tried = if avoid {
                    vec![lease.url().to_owned()]
                } else {
                    Vec::new()
                };
                drop(lease);
                self.resync(tried, last, wire, committed_len, resume).await
            }
        }
    }

    /// Books a failed call on `lease`'s drafter; the error back when another drafter
    /// should be tried, as `Err` when not.
    fn note_failure(
        &self,
        lease: &Lease,
        failure: CallFailure,
    ) -> Result<RemoteError, RemoteError> {
        warn!(url = lease.url(), error = %failure.error, "drafter call failed");
        if failure.avoid_endpoint {
            self.pool.failed(lease.endpoint());
        }
        if failure.resync {
            Ok(failure.error)
        } else {
            Err(failure.error)
        }
    }
}

fn endpoint_failed(code: Code) -> bool {
    !matches!(
        code,
        Code::NotFound | Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange
    )
}

async fn open_call(
    mut client: DrafterClient<Channel>,
    messages: Vec<WireOpen>,
    deadline: Option<std::time::Instant>,
) -> Result<OpenResponse, tonic::Status> {
    let request = with_deadline(tokio_stream::iter(messages), deadline)?;
    Ok(client.open(request).await?.into_inner())
}

async fn close_call(mut client: DrafterClient<Channel>, session_id: String) {
    let request = traced(CloseRequest {
        session_id: session_id.clone(),
    });
    match client.close(request).await {
        Ok(_) => debug!(%session_id, "drafter session closed"),
        Err(status) => warn!(%session_id, %status, "closing a drafter session failed"),
    }
}

impl Drafter for RemoteSession<'_> {
    type Carry = WireCarry;
    type Error = RemoteError;

    fn kind(&self) -> &'static str {
        SessionResume::of(self.kind).label()
    }

    async fn open(&self, request: OpenRequest<WireCarry>) -> Result<Opened, RemoteError> {
        let resume = self.state().resume.clone();
        let (resume, snapshot) = resume.opened(request.carry, &request.prompt_ids);
        self.state().cache_scope = request.cache_scope.0.clone();
        let messages = self.open_messages(
            &request.sampling,
            request.prompt_ids.len(),
            &resume,
            snapshot,
        )?;
        {
            let mut state = self.state();
            state.sampling = Some(request.sampling);
            state.resume = resume;
        }
        let mut tried = Vec::new();
        let mut lease = self.state().lease.take();
        loop {
            let current = match lease.take() {
                Some(lease) => lease,
                None => match self.pool.pick(Some(self.kind), &tried).await {
                    Some(lease) => Arc::new(lease),
                    None => {
                        return Err(RemoteError::protocol(
                            "drafter",
                            "no drafter could open the session",
                        ))
                    }
                },
            };
            tried.push(current.url().to_owned());
            match self.open_on(&current, messages.clone()).await {
                Ok(opened) => {
                    self.claim(&opened.session_id);
                    let mut state = self.state();
                    state.lease = Some(current);
                    state.session_id = Some(opened.session_id);
                    return Ok(Opened {
                        computed: opened.computed_positions.map(|n| n as usize),
                    });
                }
                Err(failure) => {
                    self.note_failure(&current, failure)?;
                }
            }
        }
    }

    async fn draft(&self, request: DraftRequest<WireCarry>) -> Result<Vec<u32>, RemoteError> {
        let request = DraftRequest {
            tree_nodes: 0,
            ..request
        };
        self.draft_round(request).await.map(|tree| tree.tokens)
    }

    async fn draft_tree(&self, request: DraftRequest<WireCarry>) -> Result<DraftTree, RemoteError> {
        self.draft_round(request).await
    }

    async fn close(&self, _session: SessionId) -> Result<(), RemoteError> {
        // A request may end while its session is still opening (the open runs beside its
        // first rounds): that session is closed when its open answers, or now if it has.
        let unclaimed = self.end_opening();
        for (client, session_id) in unclaimed {
            close_call(client, session_id).await;
        }
        // The session stays known until the call has answered: if this future is dropped
        // meanwhile (a deadline, a cancelled client), `close_detached` still closes it.
        let (lease, session_id) = {
            let state = self.state();
            (state.lease.clone(), state.session_id.clone())
        };
        if let (Some(lease), Some(session_id)) = (lease, session_id) {
            let closed = lease
                .client()
                .close(traced(CloseRequest { session_id }))
                .await;
            {
                let mut state = self.state();
                state.lease = None;
                state.session_id = None;
            }
            closed.map_err(RemoteError::drafter)?;
        }
        Ok(())
    }

    fn close_detached(&self, _session: SessionId) {
        let (lease, session_id) = {
            let mut state = self.state();
            (state.lease.take(), state.session_id.take())
        };
        let mut open = self.end_opening();
        if let (Some(lease), Some(session_id)) = (lease, session_id) {
            open.push((lease.client(), session_id));
        }
        for (client, session_id) in open {
            if !crate::detached::try_spawn(close_call(client, session_id.clone())) {
                warn!(
                    %session_id,
                    "no runtime to close the drafter session on; it will expire"
                );
            }
        }
    }
}
