//! The verifier side of one request, over gRPC: placed on a replica of the pool, and moved
//! to another one, losslessly, when its replica fails.

use specd_core::sync::lock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prost::Message as _;
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
use tonic::{Code, Status};
use tracing::{debug, info, warn, Instrument};

use crate::affinity::prefix_chain;
use crate::carry::WireCarry;
use crate::client_telemetry;
use crate::deadline::with_deadline;
use crate::error::RemoteError;
use crate::sampling::sampling_to_wire;
use crate::verifiers::{Replica, VerifierPool};
use specd_telemetry::propagation::traced;
use specd_wire::sampling::{logprob_from_wire, mask_to_wire, rules_to_wire};

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
    /// Largest K/V snapshot the router holds for one request, in encoded bytes.
    pub max_snapshot_bytes: usize,
}

/// The request's sequence: where it lives, its id there and its committed length.
#[derive(Clone)]
struct Handle {
    replica: Arc<Replica>,
    seq_id: String,
    committed_len: u32,
    /// The core round numbered 1 on this replica (a sequence moved to another replica
    /// starts its rounds again from 1 there).
    round_base: u64,
}

/// The live sequence, shared with the spawned Prefill call so that the id is recorded the
/// moment the verifier answers, whatever becomes of the request meanwhile.
#[derive(Default)]
struct SequenceState {
    live: Option<Handle>,
    /// The request has ended: a sequence the Prefill call learns of from now on is freed
    /// by that call.
    abandoned: bool,
}

/// What a sequence is rebuilt from on another replica.
#[derive(Default)]
struct History {
    /// The prompt and every token emitted so far; the cache holds all but the last.
    ids: Vec<u32>,
    prompt_len: usize,
    sampling: Option<specd_wire::Sampling>,
    rules: Option<specd_wire::LogitRules>,
    top_logprobs: Option<u32>,
    with_mtp_state: bool,
    /// The request's prefix-cache scope, which a replica it moves to keeps.
    cache_scope: String,
}

/// One request's sequence on a verifier replica, as core's [`Verifier`]. The round loop runs
/// one request per value, so the verifier-assigned id is simply kept here.
///
/// When the replica fails (connection lost, UNAVAILABLE, NOT_FOUND after a restart), the
/// sequence moves: another replica prefills the prompt and every emitted token but the last
/// (which gives the same cache, bit for bit, as the engines are row- and chunk-invariant) and
/// the failed round runs again there, with the same tokens and output index, so the keyed
/// sampler draws what it would have drawn.
pub struct RemoteSequence {
    pool: Arc<VerifierPool>,
    options: SequenceOptions,
    state: Arc<Mutex<SequenceState>>,
    history: Mutex<History>,
    migrations: Arc<AtomicU32>,
}

/// Prefill's answer, as the spawned call hands it over.
struct PrefillOutcome {
    seq_id: String,
    first_token: u32,
    cached_tokens: u32,
    committed_len: u32,
    carry: WireCarry,
    first_logprob: Option<specd_wire::TokenLogprob>,
}

impl RemoteSequence {
    /// A sequence to be placed on a replica of `pool`; moves to another replica add to
    /// `migrations`.
    pub fn new(
        pool: Arc<VerifierPool>,
        options: SequenceOptions,
        migrations: Arc<AtomicU32>,
    ) -> Self {
        Self {
            pool,
            options,
            state: Arc::default(),
            history: Mutex::default(),
            migrations,
        }
    }

    fn state(&self) -> MutexGuard<'_, SequenceState> {
        lock(&self.state)
    }

    fn history(&self) -> MutexGuard<'_, History> {
        lock(&self.history)
    }

    fn current(&self) -> Result<Handle, RemoteError> {
        self.state()
            .live
            .clone()
            .ok_or_else(|| RemoteError::protocol("verifier", "no sequence is live"))
    }

    /// Whether `status` says the replica (or the sequence on it) is gone, rather than that
    /// the request is wrong or its deadline passed.
    fn replica_lost(&self, status: &Status) -> bool {
        match status.code() {
            Code::Unavailable | Code::Unknown | Code::NotFound | Code::Aborted => true,
            // Every call carries the client's deadline, so with one set these mean it passed.
            Code::DeadlineExceeded | Code::Cancelled => self.options.deadline.is_none(),
            _ => false,
        }
    }

    /// Creates the sequence on a replica: the best one of the pool, then the next best
    /// while replicas fail. The sequence is recorded in the shared state by the call itself.
    async fn place(
        &self,
        wire: WirePrefill,
        round_base: u64,
        exclude: &mut Vec<String>,
    ) -> Result<PrefillOutcome, RemoteError> {
        // A replica that was full: its answer, should no other replica be left.
        let mut full = None;
        let prefix = prefix_chain(&wire.cache_scope, &wire.prompt_ids);
        loop {
            let Some(replica) = self.pool.pick_for(exclude, &prefix) else {
                let status =
                    full.unwrap_or_else(|| Status::unavailable("no verifier replica is reachable"));
                return Err(RemoteError::verifier(status));
            };
            match self
                .prefill_on(replica.clone(), wire.clone(), round_base)
                .await
            {
                Err(RemoteError::Status { status, .. }) if self.replica_lost(&status) => {
                    warn!(url = %replica.url(), %status, "prefill failed; trying another verifier");
                    self.pool.failed(&replica);
                    exclude.push(replica.url().to_owned());
                }
                Err(RemoteError::Status { status, .. })
                    if status.code() == Code::ResourceExhausted =>
                {
                    // Full: another replica may have room.
                    exclude.push(replica.url().to_owned());
                    full = Some(status);
                }
                other => return other,
            }
        }
    }

    /// Runs Prefill on `replica` in its own task, so that the call always learns the
    /// sequence id and records it in the shared state itself: a request dropped before or
    /// after that point finds the sequence there (`release_detached`), or the task finds the
    /// request gone and releases the sequence.
    async fn prefill_on(
        &self,
        replica: Arc<Replica>,
        wire: WirePrefill,
        round_base: u64,
    ) -> Result<PrefillOutcome, RemoteError> {
        let (sender, receiver) = oneshot::channel();
        let deadline = self.options.deadline;
        let max_snapshot_bytes = self.options.max_snapshot_bytes;
        let state = self.state.clone();
        crate::detached::spawn(
            async move {
                let client = replica.client();
                let outcome =
                    prefill_call(client.clone(), wire, deadline, max_snapshot_bytes).await;
                if let Ok(outcome) = &outcome {
                    let recorded = {
                        let mut state = lock(&state);
                        if !state.abandoned {
                            state.live = Some(Handle {
                                replica,
                                seq_id: outcome.seq_id.clone(),
                                committed_len: outcome.committed_len,
                                round_base,
                            });
                        }
                        !state.abandoned
                    };
                    if !recorded {
                        release_call(client, outcome.seq_id.clone()).await;
                        return;
                    }
                }
                let _ = sender.send(outcome);
            }
            .instrument(tracing::Span::current()),
        );
        receiver
            .await
            .map_err(|_| RemoteError::protocol("verifier", "prefill task ended early"))?
    }

    /// Moves the sequence off `lost`'s replica: the prompt and every emitted token but the
    /// last are prefilled on another replica, where the round `round` runs next.
    async fn migrate(&self, lost: &Handle, round: u32) -> Result<Handle, RemoteError> {
        self.pool.failed(&lost.replica);
        let from = lost.replica.url().to_owned();
        let span = tracing::info_span!("migrate", from = %from, to = tracing::field::Empty);
        let wire = {
            let history = self.history();
            let committed = lost.committed_len as usize;
            let emitted = history.ids.len().saturating_sub(history.prompt_len);
            WirePrefill {
                prompt_ids: history.ids[..committed.min(history.ids.len())].to_vec(),
                sampling: history.sampling,
                // The cache's room stays prompt + max_tokens.
                max_new_tokens: self
                    .options
                    .max_new_tokens
                    .saturating_sub(u32::try_from(emitted).unwrap_or(u32::MAX))
                    .saturating_add(1),
                with_mtp_state: history.with_mtp_state,
                max_chunk_bytes: self.options.max_chunk_bytes,
                cache_scope: history.cache_scope.clone(),
                rules: history.rules.clone(),
                top_logprobs: history.top_logprobs,
                // The token the new replica samples from it is not used: the round that
                // failed runs again there, with its masks.
                first_mask: Default::default(),
                emitted_in_prompt: u32::try_from(
                    committed
                        .min(history.ids.len())
                        .saturating_sub(history.prompt_len),
                )
                .unwrap_or(u32::MAX),
            }
        };
        // The lost replica may still hold the sequence (a dropped connection, not a crash).
        crate::detached::try_spawn(release_call(lost.replica.client(), lost.seq_id.clone()));
        let mut exclude = vec![from];
        let outcome = self
            .place(wire, u64::from(round), &mut exclude)
            .instrument(span.clone())
            .await?;
        if outcome.committed_len != lost.committed_len {
            return Err(RemoteError::protocol(
                "verifier",
                format!(
                    "migration: the new sequence holds {} tokens, the lost one {}",
                    outcome.committed_len, lost.committed_len
                ),
            ));
        }
        let moved = self.current()?;
        span.record("to", moved.replica.url());
        info!(parent: &span, seq_id = %moved.seq_id, "request moved to another verifier");
        self.migrations.fetch_add(1, Ordering::Relaxed);
        specd_telemetry::record::verifier_migration();
        Ok(moved)
    }

    /// The sequence's shared-K/V snapshot at its committed length, for opening a drafter
    /// session mid-request. Later K/V deltas are relative to it.
    pub async fn snapshot(&self) -> Result<Vec<SnapshotChunk>, RemoteError> {
        let handle = self.current()?;
        let request = with_deadline(
            SnapshotRequest {
                seq_id: handle.seq_id.clone(),
                max_chunk_bytes: self.options.max_chunk_bytes,
            },
            self.options.deadline,
        )
        .map_err(RemoteError::verifier)?;
        let mut stream = handle
            .replica
            .client()
            .snapshot(request)
            .await
            .map_err(RemoteError::verifier)?
            .into_inner();
        let mut chunks = SnapshotBuffer::new(self.options.max_snapshot_bytes);
        while let Some(chunk) = stream.message().await.map_err(RemoteError::verifier)? {
            chunks.push(chunk)?;
        }
        Ok(chunks.chunks)
    }
}

/// Snapshot chunks held for a drafter's Open, up to a limit on their size.
struct SnapshotBuffer {
    chunks: Vec<SnapshotChunk>,
    bytes: usize,
    limit: usize,
}

impl SnapshotBuffer {
    fn new(limit: usize) -> Self {
        Self {
            chunks: Vec::new(),
            bytes: 0,
            limit,
        }
    }

    fn push(&mut self, chunk: SnapshotChunk) -> Result<(), RemoteError> {
        self.bytes += chunk.encoded_len();
        if self.bytes > self.limit {
            return Err(RemoteError::verifier(Status::resource_exhausted(format!(
                "snapshot: the K/V snapshot exceeds the router's limit of {} bytes \
                 (--max-snapshot-bytes)",
                self.limit
            ))));
        }
        self.chunks.push(chunk);
        Ok(())
    }
}

/// Runs a whole Prefill stream: the head, then every snapshot chunk.
async fn prefill_call(
    mut client: VerifierClient<Channel>,
    request: WirePrefill,
    deadline: Option<Instant>,
    max_snapshot_bytes: usize,
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
    let mut snapshot = SnapshotBuffer::new(max_snapshot_bytes);
    let rest = async {
        while let Some(message) = stream.message().await.map_err(RemoteError::verifier)? {
            match message.body {
                Some(prefill_response::Body::Snapshot(chunk)) => snapshot.push(chunk)?,
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
        release_call(client, head.seq_id.clone()).await;
        return Err(error);
    }
    carry.snapshot = snapshot.chunks;
    Ok(PrefillOutcome {
        seq_id: head.seq_id,
        first_token: head.first_token,
        cached_tokens: head.cached_tokens,
        committed_len: head.committed_len,
        carry,
        first_logprob: head.first_logprob,
    })
}

async fn release_call(mut client: VerifierClient<Channel>, seq_id: String) {
    let request = traced(ReleaseRequest {
        seq_id: seq_id.clone(),
    });
    match client.release(request).await {
        Ok(_) => debug!(%seq_id, "verifier sequence released"),
        Err(status) => warn!(%seq_id, %status, "releasing a verifier sequence failed"),
    }
}

impl RemoteSequence {
    /// One Verify on the sequence's replica, retried once on the same replica after a
    /// transport failure (the round is idempotent, so a retry after a lost answer is safe).
    async fn verify_on(
        &self,
        handle: &Handle,
        wire: &WireVerify,
    ) -> Result<specd_wire::verifier::VerifyResponse, RemoteError> {
        let span = client_telemetry::verify_span(wire);
        let started = Instant::now();
        let mut attempt = 0;
        let response = loop {
            attempt += 1;
            let request = span
                .in_scope(|| with_deadline(wire.clone(), self.options.deadline))
                .map_err(RemoteError::verifier)?;
            match handle
                .replica
                .client()
                .verify(request)
                .instrument(span.clone())
                .await
            {
                Ok(response) => break response.into_inner(),
                Err(status) if status.code() == Code::Unavailable && attempt < VERIFY_ATTEMPTS => {
                    warn!(seq_id = %handle.seq_id, %status, "verify failed in transport; retrying");
                }
                Err(status) => return Err(RemoteError::verifier(status)),
            }
        };
        client_telemetry::verified(&span, wire, &response, started);
        Ok(response)
    }
}

impl Verifier for RemoteSequence {
    type Carry = WireCarry;
    type Error = RemoteError;

    async fn prefill(&self, request: PrefillRequest) -> Result<Prefilled<WireCarry>, RemoteError> {
        let sampling = sampling_to_wire(&request.sampling);
        // A request that runs without its drafter (declined) ships no MTP state.
        let with_mtp_state = self.options.with_mtp_state && request.want_carry;
        {
            let mut history = self.history();
            history.ids = request.prompt_ids.clone();
            history.prompt_len = request.prompt_ids.len();
            history.sampling = Some(sampling);
            history.rules = rules_to_wire(&request.rules);
            history.top_logprobs = request.top_logprobs;
            history.with_mtp_state = with_mtp_state;
            history.cache_scope = request.cache_scope.0.clone();
        }
        let wire = WirePrefill {
            prompt_ids: request.prompt_ids,
            sampling: Some(sampling),
            max_new_tokens: self.options.max_new_tokens,
            with_mtp_state,
            max_chunk_bytes: self.options.max_chunk_bytes,
            cache_scope: request.cache_scope.0,
            rules: rules_to_wire(&request.rules),
            top_logprobs: request.top_logprobs,
            first_mask: request.mask.as_ref().map(mask_to_wire).unwrap_or_default(),
            emitted_in_prompt: 0,
        };
        let outcome = self.place(wire, 0, &mut Vec::new()).await?;
        self.history().ids.push(outcome.first_token);
        Ok(Prefilled {
            first_token: outcome.first_token,
            carry: request.want_carry.then_some(outcome.carry),
            cached_tokens: outcome.cached_tokens as usize,
            first_logprob: outcome.first_logprob.as_ref().map(logprob_from_wire),
        })
    }

    async fn verify(&self, request: VerifyRequest) -> Result<Verified<WireCarry>, RemoteError> {
        let mut handle = self.current()?;
        let output_index_base = u32::try_from(request.output_index_base).map_err(|_| {
            RemoteError::protocol("router", "output index exceeds the wire's 32 bits")
        })?;
        let (response, wire) = loop {
            let wire = WireVerify {
                seq_id: handle.seq_id.clone(),
                round: u64::from(request.round) + 1 - handle.round_base,
                tokens: request.tokens.clone(),
                budget: u32::try_from(request.budget).unwrap_or(u32::MAX),
                output_index_base,
                committed_len: handle.committed_len,
                masks: request.masks.iter().map(mask_to_wire).collect(),
                parents: request.parents.clone(),
            };
            match self.verify_on(&handle, &wire).await {
                Ok(response) => break (response, wire),
                Err(RemoteError::Status { status, .. }) if self.replica_lost(&status) => {
                    warn!(
                        url = %handle.replica.url(),
                        seq_id = %handle.seq_id,
                        %status,
                        "verifier lost; moving the request"
                    );
                    handle = self.migrate(&handle, request.round).await?;
                }
                Err(error) => return Err(error),
            }
        };
        let expected = handle.committed_len as u64 + response.accepted as u64 + 1;
        if u64::from(response.committed_len) != expected {
            return Err(RemoteError::protocol(
                "verifier",
                format!(
                    "verify: committed_len {} after accepting {} from {}",
                    response.committed_len, response.accepted, wire.committed_len
                ),
            ));
        }
        if let Some(live) = self.state().live.as_mut() {
            live.committed_len = response.committed_len;
        }
        self.history().ids.extend_from_slice(&response.new_tokens);
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
            logprobs: response.logprobs.iter().map(logprob_from_wire).collect(),
        })
    }

    async fn truncate(&self, _seq: SeqId, committed_len: usize) -> Result<(), RemoteError> {
        let handle = self.current()?;
        let committed_len = u32::try_from(committed_len)
            .map_err(|_| RemoteError::protocol("router", "committed length exceeds 32 bits"))?;
        let response = handle
            .replica
            .client()
            .truncate(
                with_deadline(
                    TruncateRequest {
                        seq_id: handle.seq_id.clone(),
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
        let handle = self.state().live.clone();
        if let Some(handle) = handle {
            let released = handle
                .replica
                .client()
                .release(traced(ReleaseRequest {
                    seq_id: handle.seq_id.clone(),
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
        if !crate::detached::try_spawn(release_call(handle.replica.client(), handle.seq_id.clone()))
        {
            warn!(
                seq_id = %handle.seq_id,
                "no runtime to release the verifier sequence on; it will expire"
            );
        }
    }
}
