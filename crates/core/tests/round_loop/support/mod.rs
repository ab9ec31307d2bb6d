//! Test parts for the round loop: a deterministic table-driven target (the core is model-free
//! by design), verifier and drafter sides built on it with the crate's own sampler and
//! acceptance walk, a byte-level detokenizer, sinks, a minimal executor, and wrappers that
//! make both sides take time on tokio's clock.

pub mod executor;
pub mod pieces;
pub mod scenario;
pub mod sinks;
pub mod table_drafter;
pub mod table_target;
pub mod table_verifier;
pub mod timed;
