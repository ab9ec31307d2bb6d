//! The Verifier gRPC service on a real server bound to 127.0.0.1, running the tiny Gemma 4
//! target fixture.

mod support;

mod batching;
mod deltas;
mod errors;
mod joined_prefill;
mod lifecycle;
mod prefill;
mod prefix_cache;
mod returning_rows;
mod rounds;
mod shaping;
mod trees;

#[path = "../../../../crates/models/tests/models/qwen2_support/mod.rs"]
mod qwen2_support;
