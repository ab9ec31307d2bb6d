//! Where a request's drafts come from: nowhere, the in-process n-gram drafter, or a pool of
//! drafter services.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use specd_core::{NgramConfig, NgramDrafter};
use specd_wire::drafter::{DrafterClient, DrafterKind, DrafterStatsRequest};
use specd_wire::limits::{MessageLimits, WithMessageLimits};
use tonic::transport::{Channel, Endpoint};
use tracing::warn;

use crate::carry::WireCarry;

/// How long a drafter may take to describe itself before a request goes on without it.
const STATS_TIMEOUT: Duration = Duration::from_secs(2);

/// The drafting a router is configured for.
#[derive(Debug, Clone)]
pub enum DraftSource {
    /// Plain decoding only.
    None,
    /// Prompt lookup in the router process.
    Ngram(NgramConfig),
    /// Drafter services at these URLs (`http://host:port`), used round-robin per request.
    Remote(Vec<String>),
}

/// A drafter service as the router knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrafterInfo {
    pub kind: DrafterKind,
    pub max_draft_tokens: usize,
}

struct DrafterEndpoint {
    url: String,
    client: DrafterClient<Channel>,
    info: Mutex<Option<DrafterInfo>>,
}

/// Drafter services; each request sticks to the one it opened its session on.
pub struct DrafterPool {
    endpoints: Vec<DrafterEndpoint>,
    next: AtomicUsize,
}

/// The configured drafting, ready to serve requests.
pub enum Drafters {
    None,
    Ngram(Arc<NgramDrafter<WireCarry>>),
    Remote(DrafterPool),
}

/// A drafter URL or n-gram setting is invalid.
#[derive(Debug, thiserror::Error)]
pub enum DrafterSetupError {
    #[error("drafter url {url}: {reason}")]
    Url { url: String, reason: String },
    #[error(transparent)]
    Ngram(#[from] specd_core::ngram::NgramConfigError),
}

impl Drafters {
    /// Connects lazily: a drafter down at startup is retried by later requests.
    pub fn new(source: &DraftSource, limits: &MessageLimits) -> Result<Self, DrafterSetupError> {
        Ok(match source {
            DraftSource::None => Drafters::None,
            DraftSource::Ngram(config) => Drafters::Ngram(Arc::new(NgramDrafter::new(*config)?)),
            DraftSource::Remote(urls) => {
                let endpoints = urls
                    .iter()
                    .map(|url| {
                        let channel = Endpoint::from_shared(url.clone())
                            .map_err(|e| DrafterSetupError::Url {
                                url: url.clone(),
                                reason: e.to_string(),
                            })?
                            .connect_lazy();
                        Ok(DrafterEndpoint {
                            url: url.clone(),
                            client: DrafterClient::new(channel).with_message_limits(limits),
                            info: Mutex::new(None),
                        })
                    })
                    .collect::<Result<Vec<_>, DrafterSetupError>>()?;
                Drafters::Remote(DrafterPool {
                    endpoints,
                    next: AtomicUsize::new(0),
                })
            }
        })
    }
}

impl DrafterPool {
    /// The next usable drafter, round-robin; `None` when none answers (the request then
    /// decodes without drafts).
    pub async fn pick(&self) -> Option<(DrafterClient<Channel>, DrafterInfo)> {
        let count = self.endpoints.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for offset in 0..count {
            let endpoint = &self.endpoints[(start + offset) % count];
            if let Some(info) = endpoint.info().await {
                return Some((endpoint.client.clone(), info));
            }
        }
        None
    }
}

impl DrafterEndpoint {
    async fn info(&self) -> Option<DrafterInfo> {
        let cached = *self.info.lock().unwrap_or_else(PoisonError::into_inner);
        if cached.is_some() {
            return cached;
        }
        let stats = tokio::time::timeout(
            STATS_TIMEOUT,
            self.client.clone().stats(DrafterStatsRequest {}),
        )
        .await;
        let stats = match stats {
            Ok(Ok(stats)) => stats.into_inner(),
            Ok(Err(status)) => {
                warn!(url = %self.url, %status, "drafter stats failed");
                return None;
            }
            Err(_) => {
                warn!(url = %self.url, "drafter stats timed out");
                return None;
            }
        };
        let kind = stats.kind();
        if kind == DrafterKind::Unspecified {
            warn!(url = %self.url, "drafter reports no kind; not used");
            return None;
        }
        let info = DrafterInfo {
            kind,
            max_draft_tokens: stats.max_draft_tokens as usize,
        };
        *self.info.lock().unwrap_or_else(PoisonError::into_inner) = Some(info);
        Some(info)
    }
}
