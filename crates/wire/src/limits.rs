//! Message-size limits, explicit on both ends of every connection.
//!
//! tonic decodes at most 4 MiB per message by default and encodes without bound. specd ships
//! hidden states and K/V rows every round and whole K/V snapshots when a session opens, so
//! each service sets one limit for both directions and chunks snapshots well below it.

use crate::drafter::{DrafterClient, DrafterServer};
use crate::generation::{GenerationClient, GenerationServer};
use crate::verifier::{VerifierClient, VerifierServer};

/// Default largest gRPC message, encoded or decoded, in bytes.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Default payload of one snapshot chunk (`SnapshotData.data`), in bytes.
pub const DEFAULT_SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;

/// Upper bound on what the messages that carry a snapshot chunk (`SnapshotChunk`,
/// `PrefillResponse`, `OpenRequest`) add around its payload: tags, lengths, the part and the
/// offset. A chunk payload of at most `max_message_bytes - CHUNK_ENVELOPE_BYTES` always fits.
pub const CHUNK_ENVELOPE_BYTES: usize = 64;

/// Limits a service applies to its servers and clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageLimits {
    max_message_bytes: usize,
    snapshot_chunk_bytes: usize,
}

/// Limits that cannot work together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    #[error("snapshot chunk bytes must be at least 1")]
    EmptyChunk,
    #[error(
        "snapshot chunk of {chunk} bytes does not fit in messages of {max_message} bytes \
         (needs {CHUNK_ENVELOPE_BYTES} bytes of envelope)"
    )]
    ChunkTooLarge { chunk: usize, max_message: usize },
}

impl MessageLimits {
    /// Limits with a chunk size that leaves room for its envelope under the message limit.
    pub fn new(max_message_bytes: usize, snapshot_chunk_bytes: usize) -> Result<Self, LimitsError> {
        if snapshot_chunk_bytes == 0 {
            return Err(LimitsError::EmptyChunk);
        }
        if snapshot_chunk_bytes.saturating_add(CHUNK_ENVELOPE_BYTES) > max_message_bytes {
            return Err(LimitsError::ChunkTooLarge {
                chunk: snapshot_chunk_bytes,
                max_message: max_message_bytes,
            });
        }
        Ok(Self {
            max_message_bytes,
            snapshot_chunk_bytes,
        })
    }

    /// Largest gRPC message, encoded or decoded, in bytes.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// Largest snapshot chunk payload, in bytes.
    pub fn snapshot_chunk_bytes(&self) -> usize {
        self.snapshot_chunk_bytes
    }

    /// The chunk size to use when a peer asked for `requested` bytes (0: no preference):
    /// never above this side's own limit.
    pub fn chunk_bytes_for(&self, requested: u64) -> usize {
        match usize::try_from(requested) {
            Ok(0) => self.snapshot_chunk_bytes,
            Ok(n) => n.min(self.snapshot_chunk_bytes),
            Err(_) => self.snapshot_chunk_bytes,
        }
    }
}

impl Default for MessageLimits {
    fn default() -> Self {
        Self {
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            snapshot_chunk_bytes: DEFAULT_SNAPSHOT_CHUNK_BYTES,
        }
    }
}

/// Applies [`MessageLimits`] to a generated client or server, in both directions.
pub trait WithMessageLimits: Sized {
    #[must_use]
    fn with_message_limits(self, limits: &MessageLimits) -> Self;
}

macro_rules! limits_for_servers {
    ($($server:ident),*) => {$(
        impl<T> WithMessageLimits for $server<T> {
            fn with_message_limits(self, limits: &MessageLimits) -> Self {
                self.max_decoding_message_size(limits.max_message_bytes)
                    .max_encoding_message_size(limits.max_message_bytes)
            }
        }
    )*};
}

macro_rules! limits_for_clients {
    ($($client:ident),*) => {$(
        impl<T> WithMessageLimits for $client<T>
        where
            T: tonic::client::GrpcService<tonic::body::Body>,
            T::Error: Into<tonic::codegen::StdError>,
            T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
            <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
        {
            fn with_message_limits(self, limits: &MessageLimits) -> Self {
                self.max_decoding_message_size(limits.max_message_bytes)
                    .max_encoding_message_size(limits.max_message_bytes)
            }
        }
    )*};
}

limits_for_servers!(GenerationServer, VerifierServer, DrafterServer);
limits_for_clients!(GenerationClient, VerifierClient, DrafterClient);

/// Longest prefix-cache scope a verifier or drafter accepts, in bytes (a router sends a
/// 64-digit hash).
pub const MAX_CACHE_SCOPE_BYTES: usize = 256;

/// INVALID_ARGUMENT naming `field` when a prefix-cache scope is longer than
/// [`MAX_CACHE_SCOPE_BYTES`].
pub fn check_cache_scope(field: &str, scope: &str) -> Result<(), tonic::Status> {
    if scope.len() > MAX_CACHE_SCOPE_BYTES {
        return Err(tonic::Status::invalid_argument(format!(
            "{field}: {} bytes, at most {MAX_CACHE_SCOPE_BYTES} are allowed",
            scope.len()
        )));
    }
    Ok(())
}
