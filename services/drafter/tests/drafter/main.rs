//! The drafter: the test engine's shared-K/V mirror, and the Drafter gRPC service on a real
//! server bound to 127.0.0.1 with the random engine (which keeps exactly the state a real
//! engine of its kind keeps).

mod support;

mod batching;
mod draft_model;
mod errors;
mod lifecycle;
mod limits;
mod mirror;
mod mtp_engine;
mod mtp_rounds;
mod predraft;
mod prefix_cache;
mod recording;
mod tree_draft;

#[path = "../random_engine/mod.rs"]
mod random_engine;

#[path = "../../../../crates/models/tests/models/qwen2_support/mod.rs"]
mod qwen2_support;
