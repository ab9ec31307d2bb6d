//! The router end to end: real verifier, drafter and router servers on 127.0.0.1 running the
//! tiny Gemma 4 fixtures, driven through the public Generation API.

mod support;

mod cancellation;
mod errors;
mod fallback;
mod health;
mod limits;
mod lossless;
mod openai;
mod openai_client;
mod overlap;
mod prefix_cache;
mod streaming;
mod text;
mod trees;

#[path = "../../../drafter/tests/random_engine/mod.rs"]
mod random_engine;

#[path = "../../../../crates/models/tests/models/qwen2_support/mod.rs"]
mod qwen2_support;
