//! The commands of the `specd` binary, and what the benchmark tool (`specd-bench`) runs of
//! them: model detection and loading, the in-process drafters, the prompt's text side and the
//! `--device`/`--dtype` flags.

#![forbid(unsafe_code)]

pub mod checkpoints;
pub mod device;
pub mod draft;
pub mod draft_weights;
mod drafting_thread;
pub mod embedded_draft_model;
pub mod embedded_drafter;
pub mod embedded_mtp;
pub mod generate;
pub mod health;
pub mod model_drafter;
pub mod serve;
mod speed;
pub mod text;
