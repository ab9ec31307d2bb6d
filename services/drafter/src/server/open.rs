//! Open: reading the header and snapshot stream into an [`OpenSession`].

use specd_wire::drafter::{open_request, DrafterKind, OpenHeader, OpenRequest};
use specd_wire::kv::SnapshotAssembler;
use tonic::{Status, Streaming};

use crate::engine::{EngineInfo, OpenSession, SessionSource};
use crate::wire_kv::snapshot_kv;
use specd_wire::sampling::sampling_from_wire;

/// What an Open stream delivered, not yet decoded onto the engine's device.
pub(crate) struct ReceivedOpen {
    pub header: OpenHeader,
    pub snapshot: Option<SnapshotAssembler>,
}

/// Reads the whole Open stream, checking its order: one header, then (MTP) snapshot chunks.
pub(crate) async fn receive_open(
    stream: &mut Streaming<OpenRequest>,
    info: &EngineInfo,
    max_snapshot_bytes: usize,
) -> Result<ReceivedOpen, Status> {
    let header = match stream.message().await?.and_then(|m| m.body) {
        Some(open_request::Body::Header(header)) => header,
        Some(open_request::Body::Snapshot(_)) => {
            return Err(Status::invalid_argument(
                "open[0].header: the first message must be the header, got a snapshot chunk",
            ))
        }
        None => {
            return Err(Status::invalid_argument(
                "open[0].header: the stream must start with the header",
            ))
        }
    };
    let mut snapshot = match info.kind {
        DrafterKind::Mtp => Some(SnapshotAssembler::new("open.snapshot", max_snapshot_bytes)),
        _ => None,
    };
    let mut index = 1usize;
    while let Some(message) = stream.message().await? {
        match (message.body, snapshot.as_mut()) {
            (Some(open_request::Body::Snapshot(chunk)), Some(assembler)) => {
                assembler.push(chunk)?;
            }
            (Some(open_request::Body::Snapshot(_)), None) => {
                return Err(Status::invalid_argument(format!(
                    "open[{index}].snapshot: a draft-model drafter takes context_ids, not a snapshot"
                )))
            }
            (Some(open_request::Body::Header(_)), _) => {
                return Err(Status::invalid_argument(format!(
                    "open[{index}].header: only the first message may be a header"
                )))
            }
            (None, _) => {
                return Err(Status::invalid_argument(format!(
                    "open[{index}]: message has neither header nor snapshot"
                )))
            }
        }
        index += 1;
    }
    Ok(ReceivedOpen { header, snapshot })
}

/// Validates the header against the engine and decodes the snapshot. Blocking (the snapshot
/// is copied onto the device).
pub(crate) fn session_to_open(
    received: ReceivedOpen,
    info: &EngineInfo,
    device: &candle_core::Device,
) -> Result<OpenSession, Status> {
    let header = received.header;
    let sampling = sampling_from_wire(header.sampling.as_ref())?;
    specd_wire::limits::check_cache_scope("header.cache_scope", &header.cache_scope)?;
    let header_scope = header.cache_scope.clone();
    let committed_len = header.committed_len as usize;
    if committed_len == 0 {
        return Err(Status::invalid_argument(
            "header.committed_len: a session starts after a prefill of at least one token",
        ));
    }
    let source = match received.snapshot {
        Some(assembler) => {
            if !header.context_ids.is_empty() {
                return Err(Status::invalid_argument(
                    "header.context_ids: must be empty for an MTP drafter (it takes a snapshot)",
                ));
            }
            let snapshot = assembler.finish(device)?;
            if snapshot.committed_len != header.committed_len {
                return Err(Status::invalid_argument(format!(
                    "header.committed_len: {} but the snapshot holds {} positions",
                    header.committed_len, snapshot.committed_len
                )));
            }
            let shared =
                snapshot_kv(snapshot).map_err(|e| Status::internal(format!("snapshot: {e}")))?;
            SessionSource::Snapshot(shared)
        }
        None => {
            if info.kind != DrafterKind::DraftModel {
                return Err(Status::internal("drafter kind is unspecified"));
            }
            if header.context_ids.len() != committed_len {
                return Err(Status::invalid_argument(format!(
                    "header.context_ids: {} ids for a committed_len of {committed_len}",
                    header.context_ids.len()
                )));
            }
            check_ids(&header.context_ids, info.vocab_size, "header.context_ids")?;
            SessionSource::Context(header.context_ids)
        }
    };
    Ok(OpenSession {
        sampling,
        committed_len,
        source,
        cache_scope: specd_core::CacheScope(header_scope),
    })
}

/// INVALID_ARGUMENT naming the first id not below the vocabulary size.
pub(crate) fn check_ids(ids: &[u32], vocab_size: usize, field: &str) -> Result<(), Status> {
    match ids.iter().position(|&t| t as usize >= vocab_size) {
        Some(i) => Err(Status::invalid_argument(format!(
            "{field}[{i}]: token id {} is not below the vocabulary size {vocab_size}",
            ids[i]
        ))),
        None => Ok(()),
    }
}
