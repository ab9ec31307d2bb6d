//! The `specd.v1.Verifier` gRPC service over a [`LocalVerifier`](crate::LocalVerifier).
//!
//! Model compute runs on tokio's blocking pool, and every operation that changes a sequence
//! runs there to completion even when the caller goes away, so a cancelled RPC never leaves a
//! sequence half-updated. A Prefill stream the client drops before reading it to the end
//! releases the sequence it created; sequences idle longer than the configured timeout expire.

mod config;
mod convert;
mod prefill;
mod prefill_stream;
mod reaper;
mod resync;
mod sequences;
mod serve;
mod service;
mod status;
mod verify_round;

pub use config::VerifierServerConfig;
pub use prefill_stream::PrefillStream;
pub use serve::{serve, ServeError};
pub use service::VerifierService;
