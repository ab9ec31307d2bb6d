//! The `specd.v1.Verifier` gRPC service over a [`LocalVerifier`](crate::LocalVerifier).
//!
//! Verify rounds and prefills run on the [`BatchVerifier`](crate::BatchVerifier)'s worker
//! thread, rounds of different sequences sharing forwards. A Verify whose caller goes away
//! is dropped before its forward, or undone when its forward already ran, so a cancelled RPC
//! never leaves a sequence half-updated. A Prefill stream the client drops before reading it to the end
//! releases the sequence it created; sequences idle longer than the configured timeout expire.

mod config;
mod convert;
mod prefill;
mod prefill_stream;
mod resync;
mod sequences;
mod serve;
mod service;
mod status;
mod verify_round;
mod verify_telemetry;

pub use config::VerifierServerConfig;
pub use prefill_stream::PrefillStream;
pub use serve::{serve, ServeError};
pub use service::VerifierService;
pub use status::status_of;
