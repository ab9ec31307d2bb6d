//! Settings of the verifier server.

use std::time::Duration;

use specd_wire::limits::MessageLimits;
use specd_wire::serving::ServeOptions;

use crate::batch::BatchConfig;

/// How a verifier server talks and how long it keeps idle sequences.
#[derive(Debug, Clone)]
pub struct VerifierServerConfig {
    /// Message and snapshot-chunk limits, applied to both directions.
    pub limits: MessageLimits,
    /// Sequences untouched for this long are released; `None` keeps them until Release.
    /// A router that loses its connection cannot release, so production servers set it.
    pub idle_timeout: Option<Duration>,
    /// Identifies the loaded target in Stats (for example the checkpoint directory name).
    pub model_name: String,
    /// How verify rounds of different sequences share forwards.
    pub batch: BatchConfig,
    /// TLS, reflection and HTTP/2 limits of the listener.
    pub serving: ServeOptions,
}

impl Default for VerifierServerConfig {
    fn default() -> Self {
        Self {
            limits: MessageLimits::default(),
            idle_timeout: Some(Duration::from_secs(600)),
            model_name: String::new(),
            batch: BatchConfig::default(),
            serving: ServeOptions::default(),
        }
    }
}
