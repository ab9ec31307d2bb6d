//! The drafter side of specd: per-session drafter state behind the `specd.v1.Drafter` gRPC
//! service, generic over the model that drafts ([`DraftEngine`]).
//!
//! * [`engine`]: the engine trait and what it is handed (snapshot, per-round carry, step).
//! * [`mirror`]: the shared-K/V mirror an MTP engine keeps per session.
//! * [`mtp`]: the Gemma 4 assistant (multi-token prediction) engine.
//! * [`draft_model`]: an independent small LM (Qwen2 GGUF) with its own KV cache per session.
//! * [`random`]: an engine proposing random tokens (lossless tests, worst-case benchmarks).
//! * [`server`]: the gRPC service and a ready server with health and reflection.

pub mod draft_model;
pub mod engine;
pub mod mirror;
pub mod mtp;
pub mod random;
pub mod server;

pub use draft_model::{DraftModelEngine, DraftModelSession, DEFAULT_DRAFT_VOCAB};
pub use engine::{
    DraftCarry, DraftEngine, DraftStep, EngineError, EngineInfo, OpenSession, SessionSource,
};
pub use mirror::KvMirror;
pub use mtp::{MtpEngine, MtpSession};
pub use random::RandomDrafts;
pub use server::{serve, DrafterServerConfig, DrafterService, ServeError};
