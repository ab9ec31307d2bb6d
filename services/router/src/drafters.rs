//! Where a request's drafts come from: nowhere, the in-process n-gram drafter, a pool of
//! drafter services, or that pool behind the n-gram lookup (hybrid).

use specd_core::sync::{lock, read, write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use specd_core::{NgramConfig, NgramDrafter};
use specd_wire::drafter::{DrafterClient, DrafterKind, DrafterStatsRequest};
use specd_wire::limits::WithMessageLimits;
use specd_wire::placement::Placement;
use tonic::transport::Channel;
use tracing::{debug, warn};

use crate::affinity::PrefixAffinity;
use crate::carry::WireCarry;
use crate::discovery::{replace_discovered, resolve_periodically, Member};
use crate::pool_member::PoolMember;
use crate::upstream::{dns_host, Upstream};

/// How long a drafter may take to describe itself before a request goes on without it.
const STATS_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a drafter that failed is left out of new sessions and failovers.
pub const FAILED_DRAFTER_BACKOFF: Duration = Duration::from_secs(10);

/// The configured drafting.
#[derive(Debug, Clone)]
pub enum DraftSource {
    /// Plain decoding only.
    None,
    /// Prompt lookup in the router process.
    Ngram(NgramConfig),
    /// Drafter services at these URLs (`http://host:port`).
    Remote(Vec<String>),
    /// Drafter services at these URLs plus every address a DNS name resolves to, resolved
    /// again periodically (a Kubernetes headless service).
    Discovered { urls: Vec<String>, dns: DrafterDns },
    /// Prompt lookup in the router for rounds whose context repeats earlier text (a match of
    /// at least `lookup.min_ngram` tokens), the drafter services at `urls` and behind `dns`
    /// for the others.
    Hybrid {
        urls: Vec<String>,
        dns: Option<DrafterDns>,
        lookup: NgramConfig,
    },
}

/// A DNS name whose addresses are drafter services.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrafterDns {
    /// `host:port`.
    pub name: String,
    /// How often the name is resolved again.
    pub refresh: Duration,
}

/// A drafter service as the router knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrafterInfo {
    pub kind: DrafterKind,
    pub max_draft_tokens: usize,
    /// The drafter's vocabulary size; 0 when it does not report one.
    pub vocab_size: usize,
}

impl DrafterInfo {
    /// Whether its drafts are ids of a vocabulary of `target_vocab` tokens. A drafter that
    /// reports no vocabulary cannot be checked, so it is not used either.
    pub fn fits_vocab(&self, target_vocab: usize) -> bool {
        self.vocab_size != 0 && self.vocab_size == target_vocab
    }
}

/// One drafter endpoint and what the router tracks about it.
pub struct DrafterEndpoint {
    member: PoolMember<DrafterClient<Channel>>,
    info: Mutex<Option<DrafterInfo>>,
    /// Where the drafter runs, from its Stats (`None` when it did not say).
    placement: Mutex<Option<Placement>>,
    /// Sessions this router holds open on it (the load that picks new sessions' drafter).
    open_sessions: AtomicUsize,
}

/// Drafter services; each session sticks to one, new sessions go to the least loaded.
pub struct DrafterPool {
    endpoints: RwLock<Vec<Arc<DrafterEndpoint>>>,
    upstream: Upstream,
    /// The host of the DNS name drafters are found through, which their certificates name.
    dns_host: String,
    backoff: Duration,
    /// The verifier's vocabulary size (0: not known yet); drafters of another are not used.
    target_vocab: AtomicUsize,
    /// Held while a pick reads the loads and counts its choice, so that picks at the same
    /// moment spread out.
    choosing: Mutex<()>,
    /// The contexts sent to each drafter, whose prefixes a draft model likely caches.
    affinity: PrefixAffinity,
}

/// Open sessions a drafter holding a session's prefix may have beyond the least loaded
/// drafter's and still get the session.
pub const STICKY_SLACK: usize = 2;

/// A session's claim on an endpoint: counted as one open session while it lives.
pub struct Lease {
    endpoint: Arc<DrafterEndpoint>,
    info: DrafterInfo,
}

/// The configured drafting, ready to serve requests.
pub enum Drafters {
    None,
    Ngram(Arc<NgramDrafter<WireCarry>>),
    Remote(Arc<DrafterPool>),
    /// The pool behind the lookup of `lookup`'s settings; `lookup` alone drafts for requests
    /// that find no drafter in the pool.
    Hybrid {
        pool: Arc<DrafterPool>,
        lookup: Arc<NgramDrafter<WireCarry>>,
    },
}

/// A drafter URL, DNS name or n-gram setting is invalid.
#[derive(Debug, thiserror::Error)]
pub enum DrafterSetupError {
    #[error("drafter url {url}: {reason}")]
    Url { url: String, reason: String },
    #[error("drafter_dns {name}: {reason}")]
    Dns { name: String, reason: String },
    #[error(transparent)]
    Ngram(#[from] specd_core::ngram::NgramConfigError),
    #[error("hybrid drafting needs drafter services: give drafter urls or a drafter dns name")]
    HybridWithoutDrafters,
}

impl Drafters {
    /// Connects lazily: a drafter down at startup is retried by later requests. A DNS name
    /// is resolved in the background from now on, for as long as the pool lives.
    pub fn new(source: &DraftSource, upstream: &Upstream) -> Result<Self, DrafterSetupError> {
        Ok(match source {
            DraftSource::None => Drafters::None,
            DraftSource::Ngram(config) => Drafters::Ngram(Arc::new(NgramDrafter::new(*config)?)),
            DraftSource::Remote(urls) => Drafters::Remote(pool_of(urls, None, upstream)?),
            DraftSource::Discovered { urls, dns } => {
                Drafters::Remote(pool_of(urls, Some(dns), upstream)?)
            }
            DraftSource::Hybrid { urls, dns, lookup } => {
                if urls.is_empty() && dns.is_none() {
                    return Err(DrafterSetupError::HybridWithoutDrafters);
                }
                let lookup = Arc::new(NgramDrafter::new(*lookup)?);
                Drafters::Hybrid {
                    pool: pool_of(urls, dns.as_ref(), upstream)?,
                    lookup,
                }
            }
        })
    }

    /// The pool of drafter services, if drafts come from one.
    pub fn pool(&self) -> Option<&Arc<DrafterPool>> {
        match self {
            Drafters::Remote(pool) | Drafters::Hybrid { pool, .. } => Some(pool),
            Drafters::None | Drafters::Ngram(_) => None,
        }
    }
}

/// The drafters at `urls`, plus those `dns` resolves to from now on, for as long as the pool
/// lives.
fn pool_of(
    urls: &[String],
    dns: Option<&DrafterDns>,
    upstream: &Upstream,
) -> Result<Arc<DrafterPool>, DrafterSetupError> {
    if let Some(dns) = dns {
        if dns.name.rsplit_once(':').is_none() {
            return Err(DrafterSetupError::Dns {
                name: dns.name.clone(),
                reason: "expected host:port".into(),
            });
        }
    }
    let mut pool = DrafterPool::new(urls, upstream)?;
    if let Some(host) = dns.and_then(|dns| dns_host(&dns.name)) {
        pool.dns_host = host;
    }
    let pool = Arc::new(pool);
    if let Some(dns) = dns {
        tokio::spawn(resolve_periodically(
            Arc::downgrade(&pool),
            dns.name.clone(),
            dns.refresh,
            "drafters",
            upstream.scheme(),
            DrafterPool::set_discovered,
        ));
    }
    Ok(pool)
}

impl DrafterPool {
    /// A pool of the drafters at `urls`.
    pub fn new(urls: &[String], upstream: &Upstream) -> Result<Self, DrafterSetupError> {
        let endpoints = urls
            .iter()
            .map(|url| DrafterEndpoint::new(url, upstream, None).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            endpoints: RwLock::new(endpoints),
            upstream: upstream.clone(),
            dns_host: String::new(),
            backoff: FAILED_DRAFTER_BACKOFF,
            target_vocab: AtomicUsize::new(0),
            choosing: Mutex::new(()),
            affinity: PrefixAffinity::default(),
        })
    }

    /// Uses only drafters whose vocabulary has `vocab` tokens (the verifier's): another
    /// tokenizer's drafts would be rejected or, worse, mean other text.
    pub fn expect_vocab(&self, vocab: usize) {
        self.target_vocab.store(vocab, Ordering::Relaxed);
    }

    fn endpoints(&self) -> Vec<Arc<DrafterEndpoint>> {
        read(&self.endpoints).clone()
    }

    /// The least loaded usable drafter of `kind` (any kind when `None`), other than those
    /// in `exclude` and those backing off after a failure; `None` when none answers.
    pub async fn pick(&self, kind: Option<DrafterKind>, exclude: &[String]) -> Option<Lease> {
        self.pick_for(kind, exclude, &[]).await
    }

    /// [`Self::pick`] for a session whose context has prefix chain `prefix`: the drafter
    /// that was sent the longest prefix of it keeps the session (a conversation stays where
    /// its draft model's cache is) while it has at most [`STICKY_SLACK`] more open sessions
    /// than the least loaded one.
    pub async fn pick_for(
        &self,
        kind: Option<DrafterKind>,
        exclude: &[String],
        prefix: &[u64],
    ) -> Option<Lease> {
        let now = Instant::now();
        let candidates: Vec<_> = self
            .endpoints()
            .into_iter()
            .filter(|e| !exclude.iter().any(|u| u == e.member.url()) && !e.member.backing_off(now))
            .collect();
        // Every candidate's description first: choosing while another pick waits on one
        // would send concurrent sessions to whichever endpoint sorted first.
        let mut usable = Vec::with_capacity(candidates.len());
        for endpoint in candidates {
            let Some(info) = endpoint.info().await else {
                self.failed(&endpoint);
                continue;
            };
            if kind.is_some_and(|kind| kind != info.kind) {
                continue;
            }
            let vocab = self.target_vocab.load(Ordering::Relaxed);
            if vocab != 0 && !info.fits_vocab(vocab) {
                warn!(
                    url = %endpoint.member.url(),
                    drafter_vocab = info.vocab_size,
                    verifier_vocab = vocab,
                    "drafter vocabulary is unknown or differs from the verifier's; not used"
                );
                continue;
            }
            usable.push((endpoint, info));
        }
        let _choosing = lock(&self.choosing);
        let sessions = |e: &DrafterEndpoint| e.open_sessions.load(Ordering::Relaxed);
        let fewest = usable.iter().map(|(e, _)| sessions(e)).min()?;
        let holding = usable
            .iter()
            .enumerate()
            .map(|(i, (e, _))| {
                (
                    i,
                    self.affinity.matched_tokens(e.member.url(), prefix),
                    sessions(e),
                )
            })
            .filter(|&(_, cached, open)| cached > 0 && open <= fewest + STICKY_SLACK)
            .max_by_key(|&(_, cached, open)| (cached, std::cmp::Reverse(open)))
            .map(|(i, ..)| i);
        let chosen = match holding {
            Some(i) => i,
            None => usable
                .iter()
                .enumerate()
                .min_by_key(|(_, (e, _))| sessions(e))
                .map(|(i, _)| i)?,
        };
        let (endpoint, info) = usable.swap_remove(chosen);
        endpoint.open_sessions.fetch_add(1, Ordering::Relaxed);
        self.affinity.record(endpoint.member.url(), prefix);
        Some(Lease { endpoint, info })
    }

    /// Leaves `endpoint` out of picks for the backoff period, and asks it again what it is
    /// afterwards (it may come back as a different drafter).
    pub fn failed(&self, endpoint: &DrafterEndpoint) {
        endpoint.member.fail(self.backoff, "drafter");
        *lock(&endpoint.info) = None;
    }

    /// How many drafters the pool holds now.
    pub fn size(&self) -> usize {
        read(&self.endpoints).len()
    }

    /// The URLs in the pool now, in order.
    pub fn urls(&self) -> Vec<String> {
        self.endpoints()
            .iter()
            .map(|e| e.member.url().to_owned())
            .collect()
    }

    /// Replaces the discovered endpoints with `urls`, keeping the state of those already
    /// known; configured URLs stay whatever DNS says.
    fn set_discovered(&self, urls: &[String]) {
        let mut endpoints = write(&self.endpoints);
        replace_discovered(
            &mut endpoints,
            urls,
            |url| DrafterEndpoint::new(url, &self.upstream, Some(&self.dns_host)),
            "drafter",
        );
    }
}

impl Member for DrafterEndpoint {
    fn url(&self) -> &str {
        self.member.url()
    }

    fn discovered(&self) -> bool {
        self.member.discovered()
    }
}

impl DrafterEndpoint {
    /// `server_name`: the name a discovered drafter's certificate carries (its DNS name);
    /// `None` for configured URLs.
    fn new(
        url: &str,
        upstream: &Upstream,
        server_name: Option<&str>,
    ) -> Result<Self, DrafterSetupError> {
        let member = PoolMember::connect(url, upstream, server_name, |channel| {
            DrafterClient::new(channel).with_message_limits(&upstream.limits)
        })
        .map_err(|reason| DrafterSetupError::Url {
            url: url.to_owned(),
            reason,
        })?;
        Ok(Self {
            member,
            info: Mutex::new(None),
            placement: Mutex::new(None),
            open_sessions: AtomicUsize::new(0),
        })
    }

    async fn info(&self) -> Option<DrafterInfo> {
        let cached = *lock(&self.info);
        if cached.is_some() {
            return cached;
        }
        let stats = tokio::time::timeout(
            STATS_TIMEOUT,
            self.member.client().stats(DrafterStatsRequest {}),
        )
        .await;
        let url = self.member.url();
        let stats = match stats {
            Ok(Ok(stats)) => stats.into_inner(),
            failure => {
                let why = match failure {
                    Ok(Err(status)) => status.to_string(),
                    _ => "timed out".to_owned(),
                };
                // The caller counts the failure (`failed`); a drafter already known to be
                // down is not logged again at every retry.
                if self.member.failing() {
                    debug!(%url, %why, "drafter stats failed again");
                } else {
                    warn!(%url, %why, "drafter stats failed");
                }
                return None;
            }
        };
        self.member.answered("drafter");
        let kind = stats.kind();
        if kind == DrafterKind::Unspecified {
            warn!(url = %self.member.url(), "drafter reports no kind; not used");
            return None;
        }
        let info = DrafterInfo {
            kind,
            max_draft_tokens: stats.max_draft_tokens as usize,
            vocab_size: stats.vocab_size as usize,
        };
        debug!(url = %self.member.url(), ?info, placement = ?stats.placement, "drafter described itself");
        *lock(&self.placement) = stats.placement;
        *lock(&self.info) = Some(info);
        Some(info)
    }
}

impl Lease {
    pub fn info(&self) -> DrafterInfo {
        self.info
    }

    pub fn url(&self) -> &str {
        self.endpoint.member.url()
    }

    /// Where the drafter runs, when it said.
    pub fn placement(&self) -> Option<Placement> {
        lock(&self.endpoint.placement).clone()
    }

    pub fn client(&self) -> DrafterClient<Channel> {
        self.endpoint.member.client()
    }

    pub(crate) fn endpoint(&self) -> &DrafterEndpoint {
        &self.endpoint
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.endpoint.open_sessions.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(urls: &[&str]) -> DrafterPool {
        let urls: Vec<String> = urls.iter().map(|u| (*u).to_owned()).collect();
        DrafterPool::new(&urls, &Upstream::default()).unwrap()
    }

    #[test]
    fn only_drafters_of_the_verifiers_vocabulary_are_used() {
        let info = |vocab_size| DrafterInfo {
            kind: DrafterKind::DraftModel,
            max_draft_tokens: 4,
            vocab_size,
        };
        assert!(info(151_936).fits_vocab(151_936));
        assert!(!info(152_064).fits_vocab(151_936));
        assert!(
            !info(0).fits_vocab(151_936),
            "an unreported vocabulary is left out"
        );
    }

    #[tokio::test]
    async fn discovery_keeps_configured_urls_and_replaces_discovered_ones() {
        let pool = pool(&["http://10.0.0.1:50052"]);
        pool.set_discovered(&[
            "http://10.0.0.2:50052".into(),
            "http://10.0.0.3:50052".into(),
        ]);
        assert_eq!(
            pool.urls(),
            [
                "http://10.0.0.1:50052",
                "http://10.0.0.2:50052",
                "http://10.0.0.3:50052"
            ]
        );
        pool.set_discovered(&["http://10.0.0.3:50052".into()]);
        assert_eq!(
            pool.urls(),
            ["http://10.0.0.1:50052", "http://10.0.0.3:50052"]
        );
    }

    #[tokio::test]
    async fn hybrid_sets_up_the_pool_and_the_lookup() {
        let upstream = Upstream::default();
        let lookup = specd_core::hybrid::HYBRID_LOOKUP;
        let source = DraftSource::Hybrid {
            urls: vec!["http://10.0.0.1:50052".into()],
            dns: None,
            lookup,
        };
        let drafters = Drafters::new(&source, &upstream).unwrap();
        let Drafters::Hybrid {
            pool,
            lookup: ngram,
        } = &drafters
        else {
            panic!("not hybrid");
        };
        assert_eq!(pool.urls(), ["http://10.0.0.1:50052"]);
        assert_eq!(ngram.config(), lookup);
        assert!(drafters.pool().is_some());

        let none = DraftSource::Hybrid {
            urls: Vec::new(),
            dns: None,
            lookup,
        };
        let err = Drafters::new(&none, &upstream).err().unwrap();
        assert!(matches!(err, DrafterSetupError::HybridWithoutDrafters));
        let bad_dns = DraftSource::Hybrid {
            urls: Vec::new(),
            dns: Some(DrafterDns {
                name: "drafters".into(),
                refresh: Duration::from_secs(1),
            }),
            lookup,
        };
        let err = Drafters::new(&bad_dns, &upstream).err().unwrap();
        assert!(err.to_string().contains("host:port"), "{err}");
        let bad_lookup = DraftSource::Hybrid {
            urls: vec!["http://10.0.0.1:50052".into()],
            dns: None,
            lookup: NgramConfig {
                min_ngram: 0,
                max_ngram: 4,
            },
        };
        let err = Drafters::new(&bad_lookup, &upstream).err().unwrap();
        assert!(err.to_string().contains("min_ngram"), "{err}");
    }

    #[tokio::test]
    async fn a_bad_url_names_itself() {
        let err = DrafterPool::new(&["not a url".into()], &Upstream::default())
            .err()
            .unwrap();
        assert!(err.to_string().contains("not a url"), "{err}");
    }
}
