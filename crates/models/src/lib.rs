//! candle models for specd: the Gemma 4 target, and the loaders and kernels they share.

pub mod checkpoint;
pub mod cpu;
pub mod error;
pub mod exact;
pub mod gemma4;
pub mod gemma4_assistant;
pub mod linear;
pub mod qwen2;

pub use error::{ModelError, Result};
