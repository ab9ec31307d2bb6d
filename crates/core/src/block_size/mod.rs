//! Adaptive block size: how many tokens each round verifies.

mod controller;
mod rule;

pub use controller::{BlockSizeConfig, BlockSizeController};
pub use rule::{next_block_size, FULL_DEPTH_HIT_PERCENT, HISTORY_WINDOW, WARMUP_ROUNDS};
