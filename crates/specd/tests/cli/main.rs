//! The `specd` binary end to end, one test binary: generation and drafting in one process,
//! the split services as real processes on free ports (serving, draining, failover,
//! security, telemetry), and the real Qwen2.5-Coder pair when it has been fetched.

mod common;
mod served;

mod draft;
mod drain;
mod embedded_batching;
mod embedded_speculation;
mod failover;
mod gemma4_text;
mod generate;
mod health;
mod llama;
mod one_process;
mod real_pair;
mod registry;
mod security;
mod serve;
mod structured;
mod telemetry;

#[path = "../../../../crates/models/tests/models/qwen2_support/mod.rs"]
mod qwen2_support;
#[path = "../../../../services/drafter/tests/drafter/recording.rs"]
mod recording;
