//! The gRPC handlers.

use std::sync::Arc;

use specd_wire::placement::Placement;
use specd_wire::verifier::{
    PrefillRequest, ReleaseRequest, ReleaseResponse, SnapshotRequest, TruncateRequest,
    TruncateResponse, Verifier, VerifierStatsRequest, VerifierStatsResponse, VerifyRequest,
    VerifyResponse,
};
use specd_wire::SnapshotChunk;
use tonic::{Request, Response, Status};

use super::config::VerifierServerConfig;
use super::prefill::{plan_prefill, produce, start_prefill, stream_channel};
use super::prefill_stream::{PrefillStream, SequenceHandover};
use super::sequences::Sequences;
use super::status::join_failed;
use super::verify_telemetry;
use crate::batch::BatchVerifier;
use crate::local::LocalVerifier;
use crate::target::{TargetModel, MAX_ROLLBACK};

/// The Verifier service of one target model.
pub struct VerifierService<T: TargetModel> {
    sequences: Arc<Sequences<T>>,
    config: VerifierServerConfig,
}

impl<T: TargetModel> VerifierService<T> {
    /// A service whose rounds run through a batch scheduler on `local`'s sequences.
    pub fn new(local: Arc<LocalVerifier<T>>, config: VerifierServerConfig) -> Self {
        let batch = Arc::new(BatchVerifier::new(local, config.batch));
        Self {
            sequences: Arc::new(Sequences::new(batch)),
            config,
        }
    }

    /// The scheduler behind this service: its counters (batches, queue depth) and K/V use.
    pub fn batcher(&self) -> Arc<BatchVerifier<T>> {
        self.sequences.batch_handle()
    }

    pub fn config(&self) -> &VerifierServerConfig {
        &self.config
    }

    /// The sequences this service holds (and the reaper expires).
    pub(crate) fn sequences(&self) -> &Arc<Sequences<T>> {
        &self.sequences
    }

    /// Runs `work` on the blocking pool with this service's sequences.
    async fn blocking<R: Send + 'static>(
        &self,
        work: impl FnOnce(&Sequences<T>) -> Result<R, Status> + Send + 'static,
    ) -> Result<R, Status> {
        let sequences = self.sequences.clone();
        tokio::task::spawn_blocking(move || work(&sequences))
            .await
            .map_err(join_failed)?
    }
}

type SnapshotStream = tokio_stream::Iter<std::vec::IntoIter<Result<SnapshotChunk, Status>>>;

#[tonic::async_trait]
impl<T: TargetModel> Verifier for VerifierService<T> {
    type PrefillStream = PrefillStream;
    type SnapshotStream = SnapshotStream;

    async fn prefill(
        &self,
        request: Request<PrefillRequest>,
    ) -> Result<Response<PrefillStream>, Status> {
        let limits = self.config.limits;
        let plan = plan_prefill(&self.sequences, request.into_inner(), |asked| {
            limits.chunk_bytes_for(asked)
        })?;
        // Admission answers at once (RESOURCE_EXHAUSTED when the K/V budget is full).
        let started = start_prefill(&self.sequences, plan)?;
        let (sender, receiver) = stream_channel();
        let handover = SequenceHandover::new(self.sequences.clone());
        tokio::spawn(produce(
            self.sequences.clone(),
            started,
            sender,
            handover.clone(),
        ));
        Ok(Response::new(PrefillStream::new(receiver, handover)))
    }

    async fn verify(
        &self,
        request: Request<VerifyRequest>,
    ) -> Result<Response<VerifyResponse>, Status> {
        let started = std::time::Instant::now();
        let request = request.into_inner();
        verify_telemetry::received(&request);
        let response = self.sequences.verify(request).await?;
        verify_telemetry::answered(&response, started);
        Ok(Response::new(response))
    }

    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        let request = request.into_inner();
        let chunk_bytes = self.config.limits.chunk_bytes_for(request.max_chunk_bytes);
        let chunks = self
            .blocking(move |sequences| sequences.snapshot(&request.seq_id, chunk_bytes))
            .await?;
        let messages: Vec<_> = chunks.into_iter().map(Ok).collect();
        Ok(Response::new(tokio_stream::iter(messages)))
    }

    async fn truncate(
        &self,
        request: Request<TruncateRequest>,
    ) -> Result<Response<TruncateResponse>, Status> {
        let request = request.into_inner();
        let committed_len = self
            .blocking(move |sequences| sequences.truncate(&request.seq_id, request.committed_len))
            .await?;
        Ok(Response::new(TruncateResponse { committed_len }))
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        // Only table entries are removed; a round in flight finishes on its own copy of the
        // handle and frees the cache when it ends.
        let released = self.sequences.release_id(&request.into_inner().seq_id)?;
        Ok(Response::new(ReleaseResponse { released }))
    }

    async fn stats(
        &self,
        _request: Request<VerifierStatsRequest>,
    ) -> Result<Response<VerifierStatsResponse>, Status> {
        let model = self.config.model_name.clone();
        self.blocking(move |sequences| {
            let local = sequences.local();
            let target = local.target();
            let prefixes = local.prefix_cache();
            let totals = prefixes.counters().totals();
            Ok(VerifierStatsResponse {
                live_sequences: saturate(local.sequence_count()),
                kv_bytes: local.kv_bytes() as u64,
                kv_capacity_bytes: local.kv_capacity_bytes() as u64,
                max_sequences: saturate(local.limits().max_sequences),
                max_context_tokens: saturate(target.max_context()),
                max_block_size: saturate(MAX_ROLLBACK + 1),
                vocab_size: saturate(target.vocab_size()),
                model,
                prefix_cache_bytes: prefixes.held().0 as u64,
                prefix_cache_capacity_bytes: if prefixes.is_enabled() {
                    prefixes.max_bytes() as u64
                } else {
                    0
                },
                prefix_cache_hit_tokens: totals.hit_tokens,
                prefix_cache_lookups: totals.lookups,
                prefix_cache_evictions: totals.evictions,
                placement: Some(Placement::of_this_process()),
                verifies_trees: target.supports_trees(),
            })
        })
        .await
        .map(Response::new)
    }
}

fn saturate(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}
