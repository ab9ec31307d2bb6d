//! The verifier side of one request, over gRPC.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use specd_core::{
    ForwardCost, PrefillRequest, Prefilled, SeqId, Verified, Verifier, VerifyRequest,
};
use specd_wire::verifier::{
    prefill_response, PrefillRequest as WirePrefill, ReleaseRequest, SnapshotRequest,
    TruncateRequest, VerifierClient, VerifyRequest as WireVerify,
};
use specd_wire::SnapshotChunk;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic::Code;
use tracing::{debug, warn, Instrument};

use crate::carry::WireCarry;
use crate::client_telemetry;
use crate::deadline::with_deadline;
use crate::error::RemoteError;
use crate::sampling::sampling_to_wire;
use specd_telemetry::propagation::traced;

/// Attempts of a Verify that failed in transport; the round is idempotent, so a retry after
/// a lost answer is safe.
const VERIFY_ATTEMPTS: usize = 2;

/// What one request asks of the verifier besides the prompt.
#[derive(Debug, Clone, Copy)]
pub struct SequenceOptions {
    /// Tokens the request may generate (the verifier reserves room for them).
    pub max_new_tokens: u32,
    /// Ship hidden states and K/V to an MTP drafter.
    pub with_mtp_state: bool,
    /// Largest snapshot chunk to accept (0: the verifier's default).
    pub max_chunk_bytes: u64,
    /// The client's deadline, carried on every call.
    pub deadline: Option<Instant>,
}

/// The verifier's id and committed length of the request's sequence.
#[derive(Debug, Clone, Copy)]
struct Handle {
    seq_id: u64,
    committed_len: u32,
}

/// The live sequence, shared with the spawned Prefill call so that the id is recorded the
/// moment the verifier answers, whatever becomes of the request meanwhile.
#[derive(Debug, Default)]
struct SequenceState {
    live: Option<Handle>,
    /// The request has ended: a sequence the Prefill call learns of from now on is freed
    /// by that call.
    abandoned: bool,
}

/// One request's sequence on a remote verifier, as core's [`Verifier`]. The round loop runs
/// one request per value, so the verifier-assigned id is simply kept here.
pub struct RemoteSequence {
    client: VerifierClient<Channel>,
    options: SequenceOptions,
    state: Arc<Mutex<SequenceState>>,
}

fn lock_state(state: &Mutex<SequenceState>) -> MutexGuard<'_, SequenceState> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Prefill's answer, as the spawned call hands it over.
struct PrefillOutcome {
    seq_id: u64,
    first_token: u32,
    committed_len: u32,
    carry: WireCarry,
}

impl RemoteSequence {
    pub fn new(client: VerifierClient<Channel>, options: SequenceOptions) -> Self {
        Self {
            client,
            options,
            state: Arc::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, SequenceState> {
        lock_state(&self.state)
    }

    fn current(&self) -> Result<Handle, RemoteError> {
        self.state()
            .live
            .ok_or_else(|| RemoteError::protocol("verifier", "no sequence is live"))
    }

    /// The sequence's shared-K/V snapshot at its committed length, for opening a drafter
    /// session mid-request. Later K/V deltas are relative to it.
    pub async fn snapshot(&self) -> Result<Vec<SnapshotChunk>, RemoteError> {
        let handle = self.current()?;
        let request = with_deadline(
            SnapshotRequest {
                seq_id: handle.seq_id,
                max_chunk_bytes: self.options.max_chunk_bytes,
            },
            self.options.deadline,
        )
        .map_err(RemoteError::verifier)?;
        let mut stream = self
            .client
            .clone()
            .snapshot(request)
            .await
            .map_err(RemoteError::verifier)?
            .into_inner();
        let mut chunks = Vec::new();
        while let Some(chunk) = stream.message().await.map_err(RemoteError::verifier)? {
            chunks.push(chunk);
        }
        Ok(chunks)
    }
}

/// Runs a whole Prefill stream: the head, then every snapshot chunk.
async fn prefill_call(
    mut client: VerifierClient<Channel>,
    request: WirePrefill,
    deadline: Option<Instant>,
) -> Result<PrefillOutcome, RemoteError> {
    let request = with_deadline(request, deadline).map_err(RemoteError::verifier)?;
    let mut stream = client
        .prefill(request)
        .await
        .map_err(RemoteError::verifier)?
        .into_inner();
    let head = match stream.message().await.map_err(RemoteError::verifier)? {
        Some(message) => match message.body {
            Some(prefill_response::Body::Head(head)) => head,
            _ => return Err(RemoteError::protocol("verifier", "prefill: head missing")),
        },
        None => return Err(RemoteError::protocol("verifier", "prefill: empty stream")),
    };
    let mut carry = WireCarry {
        hidden: head.hidden,
        ..WireCarry::default()
    };
    let rest = async {
        while let Some(message) = stream.message().await.map_err(RemoteError::verifier)? {
            match message.body {
                Some(prefill_response::Body::Snapshot(chunk)) => carry.snapshot.push(chunk),
                _ => {
                    return Err(RemoteError::protocol(
                        "verifier",
                        "prefill: a second head in the stream",
                    ))
                }
            }
        }
        Ok(())
    };
    if let Err(error) = rest.await {
        release_call(client, head.seq_id).await;
        return Err(error);
    }
    Ok(PrefillOutcome {
        seq_id: head.seq_id,
        first_token: head.first_token,
        committed_len: head.committed_len,
        carry,
    })
}

async fn release_call(mut client: VerifierClient<Channel>, seq_id: u64) {
    match client.release(traced(ReleaseRequest { seq_id })).await {
        Ok(_) => debug!(seq_id, "verifier sequence released"),
        Err(status) => warn!(seq_id, %status, "releasing a verifier sequence failed"),
    }
}

impl Verifier for RemoteSequence {
    type Carry = WireCarry;
    type Error = RemoteError;

    async fn prefill(&self, request: PrefillRequest) -> Result<Prefilled<WireCarry>, RemoteError> {
        let wire = WirePrefill {
            prompt_ids: request.prompt_ids,
            sampling: Some(sampling_to_wire(&request.sampling)),
            max_new_tokens: self.options.max_new_tokens,
            // A request that runs without its drafter (declined) ships no MTP state.
            with_mtp_state: self.options.with_mtp_state && request.want_carry,
            max_chunk_bytes: self.options.max_chunk_bytes,
        };
        // The call runs in its own task so that it always learns the sequence id, and records
        // it in the shared state itself: a request dropped before or after that point finds
        // the sequence there (`release_detached`), or the task finds the request gone and
        // releases the sequence.
        let (sender, receiver) = oneshot::channel();
        let client = self.client.clone();
        let deadline = self.options.deadline;
        let state = self.state.clone();
        crate::detached::spawn(
            async move {
                let outcome = prefill_call(client.clone(), wire, deadline).await;
                if let Ok(outcome) = &outcome {
                    let recorded = {
                        let mut state = lock_state(&state);
                        if !state.abandoned {
                            state.live = Some(Handle {
                                seq_id: outcome.seq_id,
                                committed_len: outcome.committed_len,
                            });
                        }
                        !state.abandoned
                    };
                    if !recorded {
                        release_call(client, outcome.seq_id).await;
                        return;
                    }
                }
                let _ = sender.send(outcome);
            }
            .instrument(tracing::Span::current()),
        );
        let outcome = receiver
            .await
            .map_err(|_| RemoteError::protocol("verifier", "prefill task ended early"))??;
        Ok(Prefilled {
            first_token: outcome.first_token,
            carry: request.want_carry.then_some(outcome.carry),
        })
    }

    async fn verify(&self, request: VerifyRequest) -> Result<Verified<WireCarry>, RemoteError> {
        let handle = self.current()?;
        let wire = WireVerify {
            seq_id: handle.seq_id,
            round: u64::from(request.round) + 1,
            tokens: request.tokens,
            budget: u32::try_from(request.budget).unwrap_or(u32::MAX),
            output_index_base: u32::try_from(request.output_index_base).map_err(|_| {
                RemoteError::protocol("router", "output index exceeds the wire's 32 bits")
            })?,
            committed_len: handle.committed_len,
        };
        let span = client_telemetry::verify_span(&wire);
        let started = Instant::now();
        let mut attempt = 0;
        let response = loop {
            attempt += 1;
            let request = span
                .in_scope(|| with_deadline(wire.clone(), self.options.deadline))
                .map_err(RemoteError::verifier)?;
            match self
                .client
                .clone()
                .verify(request)
                .instrument(span.clone())
                .await
            {
                Ok(response) => break response.into_inner(),
                Err(status) if status.code() == Code::Unavailable && attempt < VERIFY_ATTEMPTS => {
                    warn!(seq_id = handle.seq_id, %status, "verify failed in transport; retrying");
                }
                Err(status) => return Err(RemoteError::verifier(status)),
            }
        };
        client_telemetry::verified(&span, &wire, &response, started);
        let expected = handle.committed_len as u64 + response.accepted as u64 + 1;
        if u64::from(response.committed_len) != expected {
            return Err(RemoteError::protocol(
                "verifier",
                format!(
                    "verify: committed_len {} after accepting {} from {}",
                    response.committed_len, response.accepted, handle.committed_len
                ),
            ));
        }
        if let Some(live) = self.state().live.as_mut() {
            live.committed_len = response.committed_len;
        }
        let carry = WireCarry {
            hidden: response.hidden,
            snapshot: Vec::new(),
            delta: response.kv_delta,
        };
        let forward = response.forward.map(|f| ForwardCost {
            tokens: f.tokens as usize,
            rows: f.rows as usize,
            time: Duration::from_micros(f.micros),
        });
        Ok(Verified {
            accepted: response.accepted as usize,
            new_tokens: response.new_tokens,
            carry: request.want_carry.then_some(carry),
            forward,
        })
    }

    async fn truncate(&self, _seq: SeqId, committed_len: usize) -> Result<(), RemoteError> {
        let handle = self.current()?;
        let committed_len = u32::try_from(committed_len)
            .map_err(|_| RemoteError::protocol("router", "committed length exceeds 32 bits"))?;
        let response = self
            .client
            .clone()
            .truncate(
                with_deadline(
                    TruncateRequest {
                        seq_id: handle.seq_id,
                        committed_len,
                    },
                    self.options.deadline,
                )
                .map_err(RemoteError::verifier)?,
            )
            .await
            .map_err(RemoteError::verifier)?
            .into_inner();
        if let Some(live) = self.state().live.as_mut() {
            live.committed_len = response.committed_len;
        }
        Ok(())
    }

    async fn release(&self, _seq: SeqId) -> Result<(), RemoteError> {
        // The handle stays until the call has answered: if this future is dropped meanwhile
        // (a deadline, a cancelled client), `release_detached` still knows the sequence.
        let handle = self.state().live;
        if let Some(handle) = handle {
            let released = self
                .client
                .clone()
                .release(traced(ReleaseRequest {
                    seq_id: handle.seq_id,
                }))
                .await;
            self.state().live.take();
            released.map_err(RemoteError::verifier)?;
        }
        Ok(())
    }

    fn release_detached(&self, _seq: SeqId) {
        let live = {
            let mut state = self.state();
            state.abandoned = true;
            state.live.take()
        };
        let Some(handle) = live else {
            return;
        };
        if !crate::detached::try_spawn(release_call(self.client.clone(), handle.seq_id)) {
            warn!(
                seq_id = handle.seq_id,
                "no runtime to release the verifier sequence on; it will expire"
            );
        }
    }
}
