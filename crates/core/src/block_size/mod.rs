//! Adaptive block size: how many tokens each round verifies.

mod controller;
mod cost_estimates;
mod cost_policy;
mod forward_curve;
mod governor;
mod load_cap;
mod rule;

pub use controller::{BlockSizeConfig, BlockSizeController};
pub use cost_estimates::CostEstimates;
pub use cost_policy::{CostAwarePolicy, DraftMeasurement, RoundMeasurement, RoundPlan};
pub use forward_curve::ForwardCurve;
pub use governor::{Drafting, GovernedRound, SpeculationGovernor};
pub use load_cap::load_block_cap;
pub use rule::{next_block_size, FULL_DEPTH_HIT_PERCENT, HISTORY_WINDOW, WARMUP_ROUNDS};
