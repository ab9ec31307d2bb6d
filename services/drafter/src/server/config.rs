//! Settings of the drafter server.

use std::time::Duration;

use specd_wire::limits::MessageLimits;

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
}

impl Default for DrafterServerConfig {
    fn default() -> Self {
        Self {
            limits: MessageLimits::default(),
            max_sessions: 256,
            max_snapshot_bytes: 4 << 30,
            idle_timeout: Some(Duration::from_secs(600)),
        }
    }
}
