//! A K/V snapshot chunk stream from arbitrary bytes (framing in `specd_fuzz::chunk_stream`):
//! the assembler must refuse out-of-order, overlapping, oversized and truncated streams
//! without panicking, and a stream it accepts must re-chunk into the same header and bytes.
#![no_main]

use candle_core::Device;
use libfuzzer_sys::fuzz_target;
use specd_fuzz::chunk_stream;
use specd_wire::kv::{snapshot_chunks, SnapshotAssembler};
use specd_wire::{snapshot_chunk, SnapshotChunk, SnapshotHeader};

const FIELD: &str = "open.snapshot";

fuzz_target!(|data: &[u8]| {
    let stream = chunk_stream::parse(data);
    let mut assembler = SnapshotAssembler::new(FIELD, stream.max_total_bytes);
    let mut accepted = Vec::new();
    // A receiver drops the stream at its first bad chunk.
    for chunk in stream.chunks.into_iter().flatten() {
        if let Err(error) = assembler.push(chunk.clone()) {
            assert!(error.to_string().contains(FIELD), "{error}");
            break;
        }
        accepted.push(chunk);
    }
    let complete = assembler.is_complete();
    match assembler.finish(&Device::Cpu) {
        Ok(snapshot) => {
            assert!(complete, "finish succeeded on an incomplete stream");
            let again = snapshot_chunks(&snapshot, 7).expect("an assembled snapshot re-chunks");
            assert_eq!(header(&again), header(&accepted), "header changed");
            assert_eq!(payload(&again), payload(&accepted), "bytes changed");
        }
        Err(error) => {
            assert!(!complete, "a complete stream failed to decode: {error}");
            assert!(error.to_string().contains(FIELD), "{error}");
        }
    }
});

fn header(chunks: &[SnapshotChunk]) -> Option<&SnapshotHeader> {
    chunks.iter().find_map(|c| match &c.body {
        Some(snapshot_chunk::Body::Header(header)) => Some(header),
        _ => None,
    })
}

/// Every data byte in stream order, with the part it was sent for.
fn payload(chunks: &[SnapshotChunk]) -> Vec<(i32, u8)> {
    chunks
        .iter()
        .filter_map(|c| match &c.body {
            Some(snapshot_chunk::Body::Data(data)) => Some(data),
            _ => None,
        })
        .flat_map(|data| data.data.iter().map(move |&b| (data.part, b)))
        .collect()
}
