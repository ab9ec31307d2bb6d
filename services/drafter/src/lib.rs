//! The drafter side of specd: per-session drafter state behind the `specd.v1.Drafter` gRPC
//! service, generic over the model that drafts ([`DraftEngine`]).
//!
//! * [`batch`]: drafting several sessions' rounds together (one packed forward per step).
//! * [`engine`]: the engine trait and what it is handed (snapshot, per-round carry, step).
//! * [`mtp`]: the Gemma 4 assistant (multi-token prediction) engine, whose shared-K/V mirror
//!   is the assistant's own (`specd_models::gemma4_assistant::SharedKvMirror`).
//! * [`draft_model`]: an independent small LM (Qwen2 GGUF) with its own KV cache per session.
//! * [`server`]: the gRPC service and a ready server with health and reflection.
//! * [`wire_kv`]: the server edge that turns wire K/V and hidden states into the model-side
//!   types engines take.
//!
//! The tests' random engine (random drafts through the exact protocol) lives with the tests,
//! in `tests/random_engine/`.

#![forbid(unsafe_code)]

pub mod batch;
pub mod draft_model;
pub mod engine;
pub mod kv_deltas;
pub mod mtp;
pub mod server;
pub mod tree_growth;
pub mod wire_kv;

pub use draft_model::{DraftModelEngine, DraftModelSession, DEFAULT_DRAFT_VOCAB};
pub use engine::{
    CommittedKv, DraftCarry, DraftEngine, DraftStep, EngineError, EngineInfo, LayerKv, OpenSession,
    SessionSource, SharedKv,
};
pub use mtp::{MtpEngine, MtpSession};
pub use server::{serve, DrafterServerConfig, DrafterService, ServeError};
pub use tree_growth::Branching;
