//! The drafter side of one request, over gRPC.

use std::sync::{Mutex, MutexGuard, PoisonError};

use specd_core::{DraftRequest, Drafter, OpenRequest, SessionId};
use specd_wire::drafter::{
    draft_request, open_request, CloseRequest, DraftRequest as WireDraft, DrafterClient,
    DrafterKind, MtpCarry, OpenHeader, OpenRequest as WireOpen, TokenCarry,
};
use specd_wire::WireTensor;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic::Code;
use tracing::{debug, warn};

use crate::carry::{merge_deltas, WireCarry};
use crate::error::RemoteError;
use crate::sampling::sampling_to_wire;

/// Attempts of a Draft that failed in transport (rounds are idempotent).
const DRAFT_ATTEMPTS: usize = 2;

#[derive(Debug, Clone)]
struct SessionState {
    session_id: u64,
    /// Draft calls answered so far; the drafter's round numbers count these.
    rounds: u64,
    /// The hidden state of the last carry, reused when no round happened since.
    hidden: Option<WireTensor>,
}

/// One request's session on a remote drafter, as core's [`Drafter`].
pub struct RemoteSession {
    client: DrafterClient<Channel>,
    kind: DrafterKind,
    state: Mutex<Option<SessionState>>,
}

impl RemoteSession {
    /// A session of a drafter of `kind` (which decides what each round ships).
    pub fn new(client: DrafterClient<Channel>, kind: DrafterKind) -> Self {
        Self {
            client,
            kind,
            state: Mutex::new(None),
        }
    }

    fn state(&self) -> MutexGuard<'_, Option<SessionState>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The carry of the rounds since the last draft, in this drafter's form.
    fn carry(
        &self,
        request: DraftRequest<WireCarry>,
        last_hidden: Option<WireTensor>,
    ) -> Result<(draft_request::Carry, Option<WireTensor>), RemoteError> {
        match self.kind {
            DrafterKind::Mtp => {
                let mut hidden = last_hidden;
                let mut deltas = Vec::new();
                for carry in request.carries {
                    if carry.hidden.is_some() {
                        hidden = carry.hidden;
                    }
                    deltas.extend(carry.delta);
                }
                let hidden = hidden.ok_or_else(|| {
                    RemoteError::protocol("verifier", "no hidden state for the MTP drafter")
                })?;
                let carry = MtpCarry {
                    hidden: Some(hidden.clone()),
                    delta: merge_deltas(deltas)?,
                };
                Ok((draft_request::Carry::Mtp(carry), Some(hidden)))
            }
            _ => Ok((
                draft_request::Carry::Tokens(TokenCarry {
                    committed: request.committed_tokens,
                }),
                None,
            )),
        }
    }
}

async fn open_call(
    mut client: DrafterClient<Channel>,
    messages: Vec<WireOpen>,
) -> Result<u64, RemoteError> {
    let response = client
        .open(tokio_stream::iter(messages))
        .await
        .map_err(RemoteError::drafter)?;
    Ok(response.into_inner().session_id)
}

async fn close_call(mut client: DrafterClient<Channel>, session_id: u64) {
    match client.close(CloseRequest { session_id }).await {
        Ok(_) => debug!(session_id, "drafter session closed"),
        Err(status) => warn!(session_id, %status, "closing a drafter session failed"),
    }
}

impl Drafter for RemoteSession {
    type Carry = WireCarry;
    type Error = RemoteError;

    async fn open(&self, request: OpenRequest<WireCarry>) -> Result<(), RemoteError> {
        let committed_len = u32::try_from(request.prompt_ids.len())
            .map_err(|_| RemoteError::protocol("router", "prompt length exceeds 32 bits"))?;
        let mtp = self.kind == DrafterKind::Mtp;
        let header = OpenHeader {
            sampling: Some(sampling_to_wire(&request.sampling)),
            committed_len,
            context_ids: if mtp { Vec::new() } else { request.prompt_ids },
        };
        let mut messages = vec![WireOpen {
            body: Some(open_request::Body::Header(header)),
        }];
        if mtp {
            messages.extend(request.carry.snapshot.into_iter().map(|chunk| WireOpen {
                body: Some(open_request::Body::Snapshot(chunk)),
            }));
        }
        // As with prefill: the call always completes in its own task, which closes the
        // session if this request was dropped meanwhile.
        let (sender, receiver) = oneshot::channel();
        let client = self.client.clone();
        tokio::spawn(async move {
            let outcome = open_call(client.clone(), messages).await;
            if let Err(Ok(orphan)) = sender.send(outcome) {
                close_call(client, orphan).await;
            }
        });
        let session_id = receiver
            .await
            .map_err(|_| RemoteError::protocol("drafter", "open task ended early"))??;
        *self.state() = Some(SessionState {
            session_id,
            rounds: 0,
            hidden: request.carry.hidden,
        });
        Ok(())
    }

    async fn draft(&self, request: DraftRequest<WireCarry>) -> Result<Vec<u32>, RemoteError> {
        let state = self
            .state()
            .clone()
            .ok_or_else(|| RemoteError::protocol("drafter", "no session is open"))?;
        let position = request
            .committed_len
            .checked_sub(1)
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| RemoteError::protocol("router", "invalid committed length"))?;
        let wire_round = state.rounds + 1;
        let bonus = request.bonus;
        let count = u32::try_from(request.count).unwrap_or(u32::MAX);
        let output_index_base = u32::try_from(request.output_index_base)
            .map_err(|_| RemoteError::protocol("router", "output index exceeds 32 bits"))?;
        let (carry, hidden) = self.carry(request, state.hidden)?;
        let wire = WireDraft {
            session_id: state.session_id,
            round: wire_round,
            bonus,
            position,
            count,
            output_index_base,
            carry: Some(carry),
        };
        let mut attempt = 0;
        let response = loop {
            attempt += 1;
            match self.client.clone().draft(wire.clone()).await {
                Ok(response) => break response.into_inner(),
                Err(status) if status.code() == Code::Unavailable && attempt < DRAFT_ATTEMPTS => {
                    warn!(session_id = state.session_id, %status, "draft failed in transport; retrying");
                }
                Err(status) => return Err(RemoteError::drafter(status)),
            }
        };
        if let Some(live) = self.state().as_mut() {
            live.rounds = wire_round;
            live.hidden = hidden;
        }
        Ok(response.drafts)
    }

    async fn close(&self, _session: SessionId) -> Result<(), RemoteError> {
        let state = self.state().take();
        if let Some(state) = state {
            self.client
                .clone()
                .close(CloseRequest {
                    session_id: state.session_id,
                })
                .await
                .map_err(RemoteError::drafter)?;
        }
        Ok(())
    }

    fn close_detached(&self, _session: SessionId) {
        let Some(state) = self.state().take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(close_call(self.client.clone(), state.session_id));
            }
            Err(_) => warn!(
                session_id = state.session_id,
                "no runtime to close the drafter session on; it will expire"
            ),
        }
    }
}
