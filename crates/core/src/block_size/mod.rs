//! Adaptive block size: how many tokens each round verifies.
//!
//! [`BlockPlanner`] is the entry point: it answers "the block size for this round" and learns
//! from the round's outcome. The rest are its parts: the rule over the acceptance history
//! (`rule`), the per-request controller and cost-aware policy (`controller`, `cost_policy`,
//! `cost_estimates`), the process-wide governor and its forward-cost curve (`governor`,
//! `forward_curve`), the load cap a server sets from its running requests (`load_cap`), and
//! whether a round branches into a token tree (`tree_choice`).

mod controller;
mod cost_estimates;
mod cost_policy;
mod forward_curve;
mod governor;
mod load_cap;
mod planner;
mod rule;
#[cfg(test)]
mod test_time;
mod tree_choice;

pub use controller::{BlockSizeConfig, BlockSizeController};
pub use cost_estimates::CostEstimates;
pub use cost_policy::{CostAwarePolicy, DraftMeasurement, RoundMeasurement, RoundPlan};
pub use forward_curve::ForwardCurve;
pub use governor::{Drafting, GovernedRound, OpenCost, SpeculationGovernor};
pub use load_cap::load_block_cap;
pub use planner::{BlockPlanner, DraftInProgress, PlannedBlock, RoundOutcome};
pub use rule::{next_block_size, FULL_DEPTH_HIT_PERCENT, HISTORY_WINDOW, WARMUP_ROUNDS};
pub use tree_choice::TreeChoice;
