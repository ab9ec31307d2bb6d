//! Batched verification across requests: a scheduler that runs the verify rounds of many
//! sequences in shared forwards and interleaves prompt prefills with them.

mod config;
mod counters;
mod drafting;
mod jobs;
mod prefill_task;
mod returns;
mod scheduler;
mod verify_batch;
mod worker;

pub use config::BatchConfig;
pub use counters::BatchStats;
pub use drafting::{DraftingRound, DraftingRounds};
pub use jobs::RowAnswer;
pub use scheduler::{BatchVerifier, PendingPrefill};
