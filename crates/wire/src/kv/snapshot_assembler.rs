//! Rebuilds a K/V snapshot from its chunk stream, checking order, offsets and sizes.

use candle_core::Device;

use super::error::KvWireError;
use super::header::{part_name, HeaderLayout};
use super::{KvPair, KvSnapshot};
use crate::tensor::from_le_bytes;
use crate::{snapshot_chunk, KvPart, SnapshotChunk, SnapshotData};

/// Receives the chunks of one snapshot, in stream order.
///
/// Errors name the chunk by its index in the stream, for example
/// `open.snapshot[3].data.byte_offset: expected 1048576, got 0`.
#[derive(Debug)]
pub struct SnapshotAssembler {
    field: String,
    max_total_bytes: usize,
    chunks_seen: usize,
    header: Option<HeaderLayout>,
    /// One buffer per part of the header, in stream order.
    buffers: Vec<Vec<u8>>,
}

impl SnapshotAssembler {
    /// An assembler for the stream at `field` (for example `open.snapshot`) that refuses
    /// snapshots declaring more than `max_total_bytes` of data.
    pub fn new(field: &str, max_total_bytes: usize) -> Self {
        Self {
            field: field.to_owned(),
            max_total_bytes,
            chunks_seen: 0,
            header: None,
            buffers: Vec::new(),
        }
    }

    /// Takes the next chunk of the stream.
    pub fn push(&mut self, chunk: SnapshotChunk) -> Result<(), KvWireError> {
        let field = format!("{}[{}]", self.field, self.chunks_seen);
        self.chunks_seen += 1;
        match chunk.body {
            None => Err(out_of_order(&field, "chunk has neither header nor data")),
            Some(snapshot_chunk::Body::Header(header)) => {
                if self.header.is_some() {
                    return Err(out_of_order(&field, "second header in one snapshot"));
                }
                let layout = HeaderLayout::parse(&header, &format!("{field}.header"))?;
                let declared = layout.total_bytes();
                if declared > self.max_total_bytes {
                    return Err(KvWireError::TooLarge {
                        field: format!("{field}.header"),
                        declared,
                        limit: self.max_total_bytes,
                    });
                }
                // Buffers grow as data arrives: a header alone reserves nothing.
                self.buffers = layout.parts.iter().map(|_| Vec::new()).collect();
                self.header = Some(layout);
                Ok(())
            }
            Some(snapshot_chunk::Body::Data(data)) => {
                self.push_data(&format!("{field}.data"), data)
            }
        }
    }

    /// True once the header and every declared byte have arrived.
    pub fn is_complete(&self) -> bool {
        match &self.header {
            None => false,
            Some(header) => header
                .parts
                .iter()
                .zip(&self.buffers)
                .all(|(p, buf)| buf.len() == p.layout.byte_len()),
        }
    }

    /// Decodes the complete snapshot onto `device`.
    pub fn finish(self, device: &Device) -> Result<KvSnapshot, KvWireError> {
        let header = self
            .header
            .ok_or_else(|| out_of_order(&self.field, "stream ended before the snapshot header"))?;
        let mut tensors = Vec::with_capacity(header.parts.len());
        for (part, buf) in header.parts.iter().zip(&self.buffers) {
            let name = part_name(part.part);
            if buf.len() != part.layout.byte_len() {
                return Err(KvWireError::Incomplete {
                    field: self.field.clone(),
                    part: name,
                    received: buf.len(),
                    declared: part.layout.byte_len(),
                });
            }
            let field = format!("{}.{name}", self.field);
            tensors.push(from_le_bytes(&part.layout, buf, &field, device)?);
        }
        let mut tensors = tensors.into_iter();
        let mut pair = || match (tensors.next(), tensors.next()) {
            (Some(k), Some(v)) => Some(KvPair { k, v }),
            _ => None,
        };
        let full =
            pair().ok_or_else(|| out_of_order(&self.field, "full-attention tensors missing"))?;
        let sliding = pair();
        Ok(KvSnapshot {
            committed_len: header.committed_len,
            sliding_start: header.sliding_start,
            full,
            sliding,
        })
    }

    fn push_data(&mut self, field: &str, data: SnapshotData) -> Result<(), KvWireError> {
        let Some(header) = &self.header else {
            return Err(out_of_order(field, "data before the snapshot header"));
        };
        let got_part = KvPart::try_from(data.part).map_err(|_| {
            out_of_order(
                &format!("{field}.part"),
                format!("unknown part {}", data.part),
            )
        })?;
        // The part being filled is the first one not yet complete.
        let current = header
            .parts
            .iter()
            .zip(&self.buffers)
            .position(|(p, buf)| buf.len() < p.layout.byte_len());
        let Some(index) = current else {
            return Err(out_of_order(
                field,
                "every declared byte has already arrived",
            ));
        };
        let expected = &header.parts[index];
        if got_part != expected.part {
            return Err(out_of_order(
                &format!("{field}.part"),
                format!(
                    "expected {}, got {}",
                    part_name(expected.part),
                    part_name(got_part)
                ),
            ));
        }
        let buf = &mut self.buffers[index];
        if data.byte_offset != buf.len() as u64 {
            return Err(KvWireError::Offset {
                field: field.to_owned(),
                expected: buf.len() as u64,
                got: data.byte_offset,
            });
        }
        if data.data.is_empty() {
            return Err(out_of_order(&format!("{field}.data"), "empty byte range"));
        }
        let declared = expected.layout.byte_len();
        if data.data.len() > declared - buf.len() {
            return Err(KvWireError::Overrun {
                field: field.to_owned(),
                offset: data.byte_offset,
                got: data.data.len(),
                declared,
            });
        }
        buf.extend_from_slice(&data.data);
        Ok(())
    }
}

fn out_of_order(field: &str, reason: impl Into<String>) -> KvWireError {
    KvWireError::OutOfOrder {
        field: field.to_owned(),
        reason: reason.into(),
    }
}
