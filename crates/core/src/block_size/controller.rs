//! Per-request block-size state: history, external cap and the speculation switch.

use super::cost_estimates::CostEstimates;
use super::cost_policy::{CostAwarePolicy, RoundMeasurement, RoundPlan};
use super::rule::{next_block_size, HISTORY_WINDOW};

/// Block sizes a request asks for. A block size of 1 or less means no speculation (K = 0:
/// every round verifies only the bonus token).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizeConfig {
    /// Largest verify width wanted (drafts per round + 1).
    pub requested: usize,
    /// The drafter's trained depth; sizes above it are only used while they pay off.
    pub configured: usize,
    /// Within what the rule and cap allow, pick the block size with the lowest measured cost
    /// per token, switching speculation off while plain decoding is cheaper (see
    /// [`CostAwarePolicy`]). Off: always the rule's size.
    pub cost_aware: bool,
    /// Drafts a round may verify beside its block's chain, as branches of a token tree (0:
    /// chains only). Used where the request adds nothing to the target's logits.
    pub tree_nodes: usize,
}

impl BlockSizeConfig {
    /// Plain decoding, no drafts.
    pub const PLAIN: BlockSizeConfig = BlockSizeConfig {
        requested: 1,
        configured: 1,
        cost_aware: false,
        tree_nodes: 0,
    };

    /// The same requested and configured size, every round (not cost-aware).
    pub fn fixed(block_size: usize) -> Self {
        Self {
            requested: block_size,
            configured: block_size,
            cost_aware: false,
            tree_nodes: 0,
        }
    }

    /// The §4.1 rule between `configured` and `requested`, made cost-aware.
    pub fn adaptive(requested: usize, configured: usize) -> Self {
        Self {
            requested,
            configured,
            cost_aware: true,
            tree_nodes: 0,
        }
    }

    /// This config with the cost-aware policy switched on or off.
    pub fn with_cost_aware(self, cost_aware: bool) -> Self {
        Self { cost_aware, ..self }
    }

    /// This config with rounds verifying up to `tree_nodes` branch drafts beside the chain.
    pub fn with_tree_nodes(self, tree_nodes: usize) -> Self {
        Self { tree_nodes, ..self }
    }

    /// Whether any round may draft.
    pub fn is_speculative(&self) -> bool {
        self.requested > 1
    }
}

/// Chooses each round's block size for one request.
#[derive(Clone, Debug)]
pub struct BlockSizeController {
    config: BlockSizeConfig,
    enabled: bool,
    cap: Option<usize>,
    /// Accepted counts, oldest first; trimmed to the window in batches so the rule can read
    /// a plain slice.
    history: Vec<usize>,
    /// Present when the config is cost-aware.
    policy: Option<CostAwarePolicy>,
}

impl BlockSizeController {
    /// A controller with empty history; disabled when `config` is not speculative.
    pub fn new(config: BlockSizeConfig) -> Self {
        Self {
            config,
            enabled: config.is_speculative(),
            cap: None,
            history: Vec::with_capacity(2 * HISTORY_WINDOW),
            policy: config.cost_aware.then(CostAwarePolicy::new),
        }
    }

    /// [`Self::new`], with the cost-aware policy (if any) starting from `learned`.
    pub fn with_learned(config: BlockSizeConfig, learned: Option<CostEstimates>) -> Self {
        let mut controller = Self::new(config);
        if let (Some(policy), Some(learned)) = (&mut controller.policy, learned) {
            *policy = CostAwarePolicy::with_estimates(learned);
        }
        controller
    }

    /// Block size for the next round given `remaining = max_tokens - emitted + 1`; always at
    /// least 1 and at most `remaining` (when `remaining >= 1`).
    pub fn next(&self, remaining: usize) -> usize {
        if !self.enabled {
            return 1;
        }
        let mut bs = next_block_size(
            self.config.requested,
            self.config.configured,
            &self.history,
            remaining,
        );
        if let Some(cap) = self.cap {
            bs = bs.min(cap);
        }
        bs.max(1)
    }

    /// Whether the request left its block size to the cost-aware policy.
    pub fn is_cost_aware(&self) -> bool {
        self.policy.is_some()
    }

    /// Plans the next round: [`Self::next`], then, when cost-aware, the cheapest size up to
    /// it (possibly a plain round with speculation switched off).
    pub fn plan(&mut self, remaining: usize) -> RoundPlan {
        let upper = self.next(remaining);
        match &mut self.policy {
            Some(policy) if self.enabled => policy.plan(upper),
            _ => RoundPlan {
                block_size: upper,
                speculation_off: false,
                switched: false,
            },
        }
    }

    /// Feeds a round's measured costs to the cost-aware policy, if any.
    pub fn observe(&mut self, round: &RoundMeasurement) {
        if let Some(policy) = &mut self.policy {
            policy.record(round);
        }
    }

    /// Whether the cost-aware policy has speculation switched off right now.
    pub fn is_speculation_off(&self) -> bool {
        self.policy.as_ref().is_some_and(CostAwarePolicy::is_off)
    }

    /// Records the accepted draft count of a round that drafted.
    pub fn record(&mut self, accepted: usize) {
        if self.history.len() == 2 * HISTORY_WINDOW {
            self.history.drain(..HISTORY_WINDOW);
        }
        self.history.push(accepted);
    }

    /// Caps the block size (for example under load); `None` lifts the cap. A cap of 0 or 1
    /// makes rounds plain without losing the history.
    pub fn set_cap(&mut self, cap: Option<usize>) {
        self.cap = cap;
    }

    /// The current cap.
    pub fn cap(&self) -> Option<usize> {
        self.cap
    }

    /// Switches speculation off for the rest of the request.
    pub fn disable(&mut self) {
        self.enabled = false;
    }

    /// Whether rounds may still draft.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Accepted counts of the last rounds, oldest first (at most [`HISTORY_WINDOW`]).
    pub fn history(&self) -> impl Iterator<Item = usize> + '_ {
        let start = self.history.len().saturating_sub(HISTORY_WINDOW);
        self.history[start..].iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_config_gives_block_size_one() {
        let c = BlockSizeController::new(BlockSizeConfig::PLAIN);
        assert!(!c.is_enabled());
        assert_eq!(c.next(100), 1);
        let c = BlockSizeController::new(BlockSizeConfig::fixed(0));
        assert_eq!(c.next(100), 1);
    }

    #[test]
    fn warms_up_then_grows_then_backs_off() {
        let mut c =
            BlockSizeController::new(BlockSizeConfig::adaptive(8, 4).with_cost_aware(false));
        for _ in 0..7 {
            assert_eq!(c.next(100), 4);
            c.record(3);
        }
        assert_eq!(c.next(100), 4, "7 rounds is still warm-up");
        c.record(3);
        assert_eq!(c.next(100), 8);
        for _ in 0..HISTORY_WINDOW {
            c.record(0);
        }
        assert_eq!(c.next(100), 4);
    }

    #[test]
    fn keeps_only_the_last_window() {
        let mut c = BlockSizeController::new(BlockSizeConfig::fixed(4));
        for i in 0..100 {
            c.record(i);
        }
        let history: Vec<usize> = c.history().collect();
        assert_eq!(history, (68..100).collect::<Vec<_>>());
    }

    #[test]
    fn remaining_budget_caps_the_block() {
        let c = BlockSizeController::new(BlockSizeConfig::fixed(6));
        assert_eq!(c.next(3), 3);
        assert_eq!(c.next(1), 1);
        assert_eq!(c.next(0), 1, "never below one");
    }

    #[test]
    fn external_cap_limits_and_lifts() {
        let mut c = BlockSizeController::new(BlockSizeConfig::fixed(6));
        c.set_cap(Some(2));
        assert_eq!(c.next(100), 2);
        c.set_cap(Some(0));
        assert_eq!(c.next(100), 1);
        c.set_cap(None);
        assert_eq!(c.next(100), 6);
        assert_eq!(c.cap(), None);
    }

    #[test]
    fn disable_turns_speculation_off() {
        let mut c = BlockSizeController::new(BlockSizeConfig::fixed(6));
        c.disable();
        assert!(!c.is_enabled());
        assert_eq!(c.next(100), 1);
    }

    #[test]
    fn plans_follow_the_rule_unless_cost_aware() {
        let mut c = BlockSizeController::new(BlockSizeConfig::fixed(5));
        for _ in 0..20 {
            assert_eq!(c.plan(100).block_size, 5);
            c.record(0);
        }
        let mut c = BlockSizeController::new(BlockSizeConfig::adaptive(5, 5));
        c.set_cap(Some(3));
        let plan = c.plan(100);
        assert_eq!(plan.block_size, 3, "cost-aware starts at the rule's size");
        assert!(!plan.speculation_off);
        c.disable();
        assert_eq!(c.plan(100).block_size, 1);
    }
}
