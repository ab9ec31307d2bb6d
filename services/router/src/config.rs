//! Settings of the router and what it learns from the verifier.

use std::sync::Arc;

use crate::cache_scope::PrefixCacheScope;
use crate::overlap::OverlapMode;

use specd_wire::limits::MessageLimits;
use specd_wire::serving::ServeOptions;
use specd_wire::tls::ClientTls;
use specd_wire::verifier::VerifierStatsResponse;

use crate::auth::ApiKeys;
use crate::request_limits::RequestLimits;

/// How the router serves requests.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    /// Message limits for the public API and the router's clients.
    pub limits: MessageLimits,
    /// Tokens generated when a request leaves `max_tokens` at 0 (cut to the room the
    /// context leaves).
    pub default_max_tokens: u32,
    /// Block size the adaptive policy uses (a drafter's trained depth).
    pub block_size: usize,
    /// Largest block size: the ceiling of the adaptive policy and of requested sizes.
    pub max_block_size: usize,
    /// Drafts a round may verify beside its chain as a token tree, where the target verifies
    /// trees (the engine in this process, or the verifiers' Stats say so) and rounds draft
    /// with a model (0: chains only).
    pub tree_nodes: usize,
    /// Requests running at once; more are refused with RESOURCE_EXHAUSTED.
    pub max_concurrent_requests: usize,
    /// Tokens all running requests may verify per round together: under load each
    /// request's block size is capped to its share (0: no cap).
    pub max_batch_tokens: usize,
    /// Whether draft-model drafters pre-draft the next round while the verifier verifies
    /// this one: always, never, or while it measurably pays (auto).
    pub overlap: OverlapMode,
    /// With `overlap`: likely rejections a drafter pre-drafts besides the all-accepted
    /// round (each holds a copy of the session's K/V on the drafter).
    pub predraft_branches: u32,
    /// What one request may ask.
    pub requests: RequestLimits,
    /// Largest K/V snapshot the router holds for one request (an MTP drafter's Open), in
    /// bytes.
    pub max_snapshot_bytes: usize,
    /// API keys clients must present; `None`: the API is open.
    pub api_keys: Option<Arc<ApiKeys>>,
    /// TLS, reflection and HTTP/2 limits of the router's own listener.
    pub serving: ServeOptions,
    /// TLS towards the verifiers and drafters; `None`: plaintext.
    pub upstream_tls: Option<ClientTls>,
    /// Which requests share cached prompt prefixes.
    pub prefix_cache_scope: PrefixCacheScope,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            limits: MessageLimits::default(),
            default_max_tokens: 256,
            block_size: 4,
            max_block_size: 8,
            tree_nodes: 0,
            max_concurrent_requests: 64,
            max_batch_tokens: 32,
            overlap: OverlapMode::Auto,
            predraft_branches: 1,
            requests: RequestLimits::default(),
            max_snapshot_bytes: 1 << 30,
            api_keys: None,
            serving: ServeOptions::default(),
            upstream_tls: None,
            prefix_cache_scope: PrefixCacheScope::Key,
        }
    }
}

impl RouterConfig {
    /// The largest block size a request may verify: this router's and the verifier's
    /// limits, and at least 1.
    pub fn block_ceiling(&self, limits: &TargetLimits) -> usize {
        self.max_block_size.min(limits.max_block_size).max(1)
    }
}

/// What the router checks requests against, from the verifier's Stats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetLimits {
    pub vocab_size: usize,
    pub max_context_tokens: usize,
    pub max_block_size: usize,
    pub model: String,
    /// The target verifies token trees.
    pub verifies_trees: bool,
}

impl From<VerifierStatsResponse> for TargetLimits {
    fn from(stats: VerifierStatsResponse) -> Self {
        Self {
            vocab_size: stats.vocab_size as usize,
            max_context_tokens: stats.max_context_tokens as usize,
            max_block_size: stats.max_block_size as usize,
            model: stats.model,
            verifies_trees: stats.verifies_trees,
        }
    }
}
