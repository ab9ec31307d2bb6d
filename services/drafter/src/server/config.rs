//! Settings of the drafter server.

use std::time::Duration;

use specd_wire::limits::MessageLimits;
use specd_wire::serving::ServeOptions;

/// Limits of one drafter server.
#[derive(Debug, Clone)]
pub struct DrafterServerConfig {
    /// Message limits, applied to both directions.
    pub limits: MessageLimits,
    /// Open sessions at most; Open beyond it is RESOURCE_EXHAUSTED.
    pub max_sessions: usize,
    /// Largest snapshot (all four tensors together) a session may be opened from, in bytes.
    pub max_snapshot_bytes: usize,
    /// Sessions untouched for this long are closed; `None` keeps them until Close.
    pub idle_timeout: Option<Duration>,
    /// Opens receiving or loading at once; more are refused with RESOURCE_EXHAUSTED.
    pub max_concurrent_opens: usize,
    /// How long an Open may take, from its first message to a ready session.
    pub open_timeout: Duration,
    /// K/V positions all sessions may hold together (each its committed tokens and the
    /// drafts of its last round); an Open or a draft past it is RESOURCE_EXHAUSTED. `None`:
    /// only `max_sessions` bounds them.
    pub max_kv_tokens: Option<usize>,
    /// TLS, reflection and HTTP/2 limits of the listener.
    pub serving: ServeOptions,
}

impl Default for DrafterServerConfig {
    fn default() -> Self {
        Self {
            limits: MessageLimits::default(),
            max_sessions: 256,
            max_snapshot_bytes: 4 << 30,
            idle_timeout: Some(Duration::from_secs(600)),
            max_concurrent_opens: 8,
            open_timeout: Duration::from_secs(60),
            max_kv_tokens: None,
            serving: ServeOptions::default(),
        }
    }
}
