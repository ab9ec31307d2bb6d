//! The verifier side of specd: owns target-model sequences and their caches, and runs
//! verify-accept-rollback rounds.

#![forbid(unsafe_code)]

mod admission;
pub mod batch;
mod carry;
mod error;
mod local;
pub mod server;
mod target;
mod verify_block;

pub use admission::KvBudget;
pub use batch::{BatchConfig, BatchStats, BatchVerifier};
pub use carry::TargetCarry;
pub use error::VerifierError;
pub use local::{LocalVerifier, VerifierLimits};
pub use target::{AnyTarget, Gemma4Target, LmTarget, Qwen2Target, TargetModel, MAX_ROLLBACK};
pub use verify_block::{block_tokens, head_tokens, HeadRows};
