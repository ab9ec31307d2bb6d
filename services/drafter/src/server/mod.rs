//! The `specd.v1.Drafter` gRPC service over a [`DraftEngine`](crate::DraftEngine).
//!
//! Opens run on tokio's blocking pool; rounds (applying a carry, drafting, pre-drafting)
//! run on one drafting thread that batches every session's forwards. Rounds are idempotent: a retried Draft returns the stored drafts without applying
//! its carry twice. Sessions idle longer than the configured timeout are closed.

mod batcher;
mod config;
mod draft_round;
mod open;
mod serve;
mod service;
mod sessions;
mod status;

pub use config::DrafterServerConfig;
pub use serve::{serve, ServeError};
pub use service::DrafterService;
