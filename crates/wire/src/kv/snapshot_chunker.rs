//! Splits a K/V snapshot into a header and byte-range chunks.

use bytes::Bytes;

use super::error::{inconsistent, KvWireError};
use super::header::HeaderLayout;
use super::KvSnapshot;
use crate::tensor::{encode_le_bytes, TensorLayout};
use crate::{snapshot_chunk, KvPart, SnapshotChunk, SnapshotData, SnapshotHeader, TensorSpec};

/// The snapshot as a stream of chunks: a header, then the bytes of full_k, full_v, sliding_k,
/// sliding_v in that order, each chunk's payload at most `chunk_bytes` long.
///
/// The snapshot is checked the way a receiver checks it, so an inconsistent snapshot is
/// caught by its sender.
pub fn snapshot_chunks(
    snapshot: &KvSnapshot,
    chunk_bytes: usize,
) -> Result<Vec<SnapshotChunk>, KvWireError> {
    const FIELD: &str = "snapshot";
    if chunk_bytes == 0 {
        return Err(inconsistent(FIELD, "chunk size must be at least 1 byte"));
    }
    let mut tensors = vec![
        (KvPart::FullK, &snapshot.full.k),
        (KvPart::FullV, &snapshot.full.v),
    ];
    if let Some(sliding) = &snapshot.sliding {
        tensors.push((KvPart::SlidingK, &sliding.k));
        tensors.push((KvPart::SlidingV, &sliding.v));
    }

    let mut specs = Vec::with_capacity(tensors.len());
    let mut payloads = Vec::with_capacity(tensors.len());
    for (part, tensor) in tensors {
        let field = format!("{FIELD}.{}", super::header::part_name(part));
        let (layout, data) = encode_le_bytes(tensor, &field)?;
        specs.push(spec_of(&layout));
        payloads.push((part, Bytes::from(data)));
    }
    let mut specs = specs.into_iter();
    let header = SnapshotHeader {
        committed_len: snapshot.committed_len,
        sliding_start: snapshot.sliding_start,
        full_k: specs.next(),
        full_v: specs.next(),
        sliding_k: specs.next(),
        sliding_v: specs.next(),
    };
    HeaderLayout::parse(&header, &format!("{FIELD}.header"))?;

    let mut chunks = vec![SnapshotChunk {
        body: Some(snapshot_chunk::Body::Header(header)),
    }];
    for (part, data) in payloads {
        let mut offset = 0;
        while offset < data.len() {
            let end = data.len().min(offset + chunk_bytes);
            chunks.push(SnapshotChunk {
                body: Some(snapshot_chunk::Body::Data(SnapshotData {
                    part: part.into(),
                    byte_offset: offset as u64,
                    data: data.slice(offset..end),
                })),
            });
            offset = end;
        }
    }
    Ok(chunks)
}

fn spec_of(layout: &TensorLayout) -> TensorSpec {
    TensorSpec {
        dtype: layout.dtype().as_str().to_owned(),
        shape: layout.wire_shape(),
    }
}
