//! The verifier replicas behind one router: each serves the same target; a new request goes
//! to the replica with the most free K/V budget, and a replica that fails is avoided for a
//! while and probed back.

use specd_core::sync::{lock, read, write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use specd_wire::limits::WithMessageLimits;
use specd_wire::placement::Placement;
use specd_wire::verifier::{VerifierClient, VerifierStatsRequest, VerifierStatsResponse};
use tokio::sync::watch;
use tonic::transport::Channel;
use tracing::warn;

use crate::affinity::PrefixAffinity;
use crate::config::TargetLimits;
use crate::discovery::{replace_discovered, resolve, resolve_periodically, Member};
use crate::pool_member::PoolMember;
use crate::upstream::{dns_host, Upstream};

/// How often every replica's Stats are read (placement, identity, probing failed ones back).
pub const STATS_REFRESH: Duration = Duration::from_millis(500);

/// How long one Stats call may take before the replica counts as unreachable.
const STATS_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a verifier that failed is left out of new requests and migrations.
pub const FAILED_VERIFIER_BACKOFF: Duration = Duration::from_secs(10);

/// Where the verifiers are.
#[derive(Debug, Clone, Default)]
pub struct VerifierSource {
    /// Verifier URLs (`http://host:port`).
    pub urls: Vec<String>,
    /// A DNS name whose addresses are verifiers, resolved again periodically (a Kubernetes
    /// headless service).
    pub dns: Option<VerifierDns>,
    /// How long a failed verifier is avoided before it is probed back.
    pub backoff: Duration,
}

impl VerifierSource {
    /// One verifier.
    pub fn single(url: impl Into<String>) -> Self {
        Self {
            urls: vec![url.into()],
            dns: None,
            backoff: FAILED_VERIFIER_BACKOFF,
        }
    }
}

/// A DNS name (`host:port`) whose addresses are verifiers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifierDns {
    pub name: String,
    pub refresh: Duration,
}

/// A verifier URL or DNS name is invalid.
#[derive(Debug, thiserror::Error)]
pub enum VerifierSetupError {
    #[error("verifier url {url}: {reason}")]
    Url { url: String, reason: String },
    #[error("verifier_dns {name}: expected host:port")]
    Dns { name: String },
    #[error("no verifier: give verifier urls or a verifier dns name")]
    Empty,
}

/// What the router last read from a replica's Stats.
#[derive(Debug, Clone, Copy)]
struct Load {
    live_sequences: u64,
    kv_bytes: u64,
    /// 0: unbounded.
    kv_capacity_bytes: u64,
}

/// One verifier replica.
pub struct Replica {
    member: PoolMember<VerifierClient<Channel>>,
    /// The last Stats: `None` until it answers, and while it does not.
    load: Mutex<Option<Load>>,
    /// Serves another target than the pool's: never used.
    mismatched: AtomicBool,
    /// Sequences placed here since the last Stats (which do not count them yet).
    placed_since_stats: AtomicUsize,
    /// Where the replica runs, from its last Stats.
    placement: Mutex<Option<Placement>>,
}

impl Replica {
    /// `server_name`: the name a discovered replica's certificate carries (its DNS name);
    /// `None` for configured URLs.
    fn new(
        url: &str,
        upstream: &Upstream,
        server_name: Option<&str>,
    ) -> Result<Self, VerifierSetupError> {
        let member = PoolMember::connect(url, upstream, server_name, |channel| {
            VerifierClient::new(channel).with_message_limits(&upstream.limits)
        })
        .map_err(|reason| VerifierSetupError::Url {
            url: url.to_owned(),
            reason,
        })?;
        Ok(Self {
            member,
            load: Mutex::new(None),
            mismatched: AtomicBool::new(false),
            placed_since_stats: AtomicUsize::new(0),
            placement: Mutex::new(None),
        })
    }

    pub fn url(&self) -> &str {
        self.member.url()
    }

    pub fn client(&self) -> VerifierClient<Channel> {
        self.member.client()
    }

    async fn stats(&self) -> Option<VerifierStatsResponse> {
        match tokio::time::timeout(
            STATS_TIMEOUT,
            self.member.client().stats(VerifierStatsRequest {}),
        )
        .await
        {
            Ok(Ok(stats)) => Some(stats.into_inner()),
            _ => None,
        }
    }

    /// Neither backing off after a failure nor serving another target.
    fn usable(&self, now: Instant) -> bool {
        !self.member.backing_off(now) && !self.mismatched.load(Ordering::Relaxed)
    }

    /// Free K/V budget after the sequences placed since the last Stats, each assumed to
    /// reserve what the replica's live ones hold on average.
    fn free_bytes(&self, load: &Load) -> u64 {
        let capacity = match load.kv_capacity_bytes {
            0 => u64::MAX,
            bytes => bytes,
        };
        let placed = self.placed_since_stats.load(Ordering::Relaxed) as u64;
        let per_sequence = load.kv_bytes / load.live_sequences.max(1);
        capacity
            .saturating_sub(load.kv_bytes)
            .saturating_sub(placed.saturating_mul(per_sequence))
    }
}

/// The replicas of one target.
pub struct VerifierPool {
    replicas: RwLock<Vec<Arc<Replica>>>,
    upstream: Upstream,
    /// The host of the DNS name replicas are found through, which their certificates name.
    dns_host: String,
    backoff: Duration,
    /// What every replica must serve (from the first one that answered).
    target: TargetLimits,
    /// Whether any replica answers (router health follows it).
    reachable: watch::Sender<bool>,
    /// The prompt prefixes sent to each replica, whose K/V it likely caches.
    affinity: PrefixAffinity,
}

impl VerifierPool {
    /// Connects lazily to every URL, waits up to `wait` for one replica to answer Stats (it
    /// may still be loading) and takes its target as the pool's; then reads every replica's
    /// Stats every [`STATS_REFRESH`] and resolves `source.dns` again as it says, for as long
    /// as the pool lives.
    pub async fn connect(
        source: &VerifierSource,
        upstream: &Upstream,
        wait: Duration,
    ) -> Result<Arc<Self>, PoolError> {
        if let Some(dns) = &source.dns {
            if dns.name.rsplit_once(':').is_none() {
                return Err(VerifierSetupError::Dns {
                    name: dns.name.clone(),
                }
                .into());
            }
        }
        let mut replicas = source
            .urls
            .iter()
            .map(|url| Replica::new(url, upstream, None).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let dns_host = source
            .dns
            .as_ref()
            .and_then(|dns| dns_host(&dns.name))
            .unwrap_or_default();
        let deadline = Instant::now() + wait;
        let target = loop {
            if let Some(dns) = &source.dns {
                if let Some(urls) = resolve(&dns.name, "verifiers", upstream.scheme()).await {
                    replace_discovered(
                        &mut replicas,
                        &urls,
                        |url| Replica::new(url, upstream, Some(&dns_host)),
                        "verifier",
                    );
                }
            }
            if replicas.is_empty() && source.dns.is_none() {
                return Err(VerifierSetupError::Empty.into());
            }
            let mut answered = None;
            for replica in &replicas {
                if let Some(stats) = replica.stats().await {
                    answered = Some(TargetLimits::from(stats));
                    break;
                }
            }
            match answered {
                Some(target) => break target,
                None if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                None => {
                    return Err(PoolError::Unavailable {
                        urls: replicas.iter().map(|r| r.url().to_owned()).collect(),
                        waited: wait,
                    })
                }
            }
        };
        let (reachable, _) = watch::channel(true);
        let pool = Arc::new(Self {
            replicas: RwLock::new(replicas),
            upstream: upstream.clone(),
            dns_host,
            backoff: source.backoff,
            target,
            reachable,
            affinity: PrefixAffinity::default(),
        });
        pool.refresh().await;
        tokio::spawn(refresh_periodically(Arc::downgrade(&pool)));
        if let Some(dns) = source.dns.clone() {
            tokio::spawn(resolve_periodically(
                Arc::downgrade(&pool),
                dns.name,
                dns.refresh,
                "verifiers",
                upstream.scheme(),
                VerifierPool::set_discovered,
            ));
        }
        Ok(pool)
    }

    /// What the replicas serve.
    pub fn target(&self) -> &TargetLimits {
        &self.target
    }

    /// Follows whether any replica answers.
    pub fn reachable(&self) -> watch::Receiver<bool> {
        self.reachable.subscribe()
    }

    fn replicas(&self) -> Vec<Arc<Replica>> {
        read(&self.replicas).clone()
    }

    /// The replica for a new sequence: the most free K/V budget, ties (free budgets within a
    /// thirty-second of the capacity of the best) to the fewest live sequences; never one in
    /// `exclude`, backing off, silent or serving another target.
    pub fn pick(&self, exclude: &[String]) -> Option<Arc<Replica>> {
        self.pick_for(exclude, &[])
    }

    /// [`Self::pick`] for a prompt of prefix chain `prefix` (see
    /// [`crate::affinity::prefix_chain`]): a replica that was sent the longest prefix of it
    /// takes it while its free budget is within a quarter of its capacity of the most free
    /// one's (so one hot prefix does not pile every request onto one replica); the prompt is
    /// then remembered as sent there.
    pub fn pick_for(&self, exclude: &[String], prefix: &[u64]) -> Option<Arc<Replica>> {
        let now = Instant::now();
        let candidates: Vec<_> = self
            .replicas()
            .into_iter()
            .filter(|r| !exclude.iter().any(|u| u == r.url()) && r.usable(now))
            .filter_map(|r| {
                let load = (*lock(&r.load))?;
                let free = r.free_bytes(&load);
                let tie = (load.kv_capacity_bytes / 32).max(1 << 20);
                let near = (load.kv_capacity_bytes / 4).max(1 << 20);
                let busy =
                    load.live_sequences + r.placed_since_stats.load(Ordering::Relaxed) as u64;
                let cached = self.affinity.matched_tokens(r.url(), prefix);
                Some((r, free, tie, near, busy, cached))
            })
            .collect();
        let most_free = candidates.iter().map(|c| c.1).max()?;
        let holding = candidates
            .iter()
            .filter(|(_, free, _, near, _, cached)| *cached > 0 && most_free - free <= *near)
            .max_by_key(|(_, _, _, _, busy, cached)| (*cached, std::cmp::Reverse(*busy)))
            .map(|c| c.0.clone());
        let best = match holding {
            Some(replica) => replica,
            None => {
                candidates
                    .into_iter()
                    .filter(|(_, free, tie, ..)| most_free - free <= *tie)
                    .min_by_key(|(_, _, _, _, busy, _)| *busy)?
                    .0
            }
        };
        best.placed_since_stats.fetch_add(1, Ordering::Relaxed);
        self.affinity.record(best.url(), prefix);
        Some(best)
    }

    /// Leaves `replica` out until it has backed off and answers Stats again.
    pub fn failed(&self, replica: &Replica) {
        replica.member.fail(self.backoff, "verifier");
        self.affinity.forget(replica.url());
        *lock(&replica.load) = None;
        self.update_reachable();
    }

    /// Where the replicas that said so run.
    pub fn placements(&self) -> Vec<Placement> {
        self.replicas()
            .iter()
            .filter_map(|replica| lock(&replica.placement).clone())
            .collect()
    }

    /// Reads every replica's Stats once, all at the same time.
    async fn refresh(&self) {
        let replicas = self.replicas();
        let mut reads = tokio::task::JoinSet::new();
        for (i, replica) in replicas.iter().enumerate() {
            let replica = replica.clone();
            reads.spawn(async move { (i, replica.stats().await) });
        }
        while let Some(read) = reads.join_next().await {
            let Ok((i, stats)) = read else { continue };
            self.record(&replicas[i], stats);
        }
        self.update_reachable();
    }

    /// What one Stats read says about `replica`.
    fn record(&self, replica: &Replica, stats: Option<VerifierStatsResponse>) {
        replica.placed_since_stats.store(0, Ordering::Relaxed);
        let Some(stats) = stats else {
            *lock(&replica.load) = None;
            return;
        };
        let load = Load {
            live_sequences: u64::from(stats.live_sequences),
            kv_bytes: stats.kv_bytes,
            kv_capacity_bytes: stats.kv_capacity_bytes,
        };
        if stats.placement.is_some() {
            *lock(&replica.placement) = stats.placement.clone();
        }
        let serves = TargetLimits::from(stats);
        let mismatched = serves.vocab_size != self.target.vocab_size
            || serves.model != self.target.model
            || serves.max_context_tokens != self.target.max_context_tokens
            || serves.verifies_trees != self.target.verifies_trees;
        let was = replica.mismatched.swap(mismatched, Ordering::Relaxed);
        if mismatched && !was {
            warn!(
                url = %replica.url(),
                model = %serves.model,
                vocab = serves.vocab_size,
                expected_model = %self.target.model,
                expected_vocab = self.target.vocab_size,
                verifies_trees = serves.verifies_trees,
                "verifier serves another target (or verifies trees where the pool does not, or \
                 the other way round); not used"
            );
        }
        // A failed replica stays out for its backoff, then is back once it answers.
        let now = Instant::now();
        if replica.member.backing_off(now) {
            return;
        }
        replica.member.answered("verifier");
        *lock(&replica.load) = Some(load);
    }

    fn update_reachable(&self) {
        let now = Instant::now();
        let any = self
            .replicas()
            .iter()
            .any(|r| r.usable(now) && lock(&r.load).is_some());
        self.reachable
            .send_if_modified(|was| std::mem::replace(was, any) != any);
    }

    /// Replaces the discovered replicas with `urls`, keeping the state of those already
    /// known; configured URLs stay whatever DNS says.
    fn set_discovered(&self, urls: &[String]) {
        let mut replicas = write(&self.replicas);
        replace_discovered(
            &mut replicas,
            urls,
            |url| Replica::new(url, &self.upstream, Some(&self.dns_host)),
            "verifier",
        );
    }
}

impl Member for Replica {
    fn url(&self) -> &str {
        self.member.url()
    }

    fn discovered(&self) -> bool {
        self.member.discovered()
    }
}

/// The pool could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Setup(#[from] VerifierSetupError),
    #[error("no verifier of {urls:?} answered Stats within {waited:?}")]
    Unavailable { urls: Vec<String>, waited: Duration },
}

async fn refresh_periodically(pool: Weak<VerifierPool>) {
    loop {
        tokio::time::sleep(STATS_REFRESH).await;
        let Some(pool) = pool.upgrade() else { return };
        pool.refresh().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(urls: &[&str]) -> VerifierPool {
        let upstream = Upstream::default();
        let replicas = urls
            .iter()
            .map(|url| Arc::new(Replica::new(url, &upstream, None).unwrap()))
            .collect();
        VerifierPool {
            replicas: RwLock::new(replicas),
            upstream,
            dns_host: String::new(),
            backoff: Duration::from_secs(10),
            target: TargetLimits {
                vocab_size: 256,
                max_context_tokens: 1024,
                max_block_size: 8,
                model: "m".into(),
                verifies_trees: false,
            },
            reachable: watch::channel(true).0,
            affinity: PrefixAffinity::default(),
        }
    }

    /// What a Stats read would record.
    fn set_load(pool: &VerifierPool, i: usize, live: u64, kv_bytes: u64) {
        let replica = &pool.replicas()[i];
        replica.placed_since_stats.store(0, Ordering::Relaxed);
        *lock(&replica.load) = Some(Load {
            live_sequences: live,
            kv_bytes,
            kv_capacity_bytes: 1 << 30,
        });
    }

    #[tokio::test]
    async fn a_prompt_goes_where_its_prefix_went_unless_that_replica_is_much_fuller() {
        let pool = pool(&["http://10.0.0.1:1", "http://10.0.0.2:1"]);
        let (a, b) = ("http://10.0.0.1:1", "http://10.0.0.2:1");
        let turn1: Vec<u32> = (0..200).collect();
        let turn2: Vec<u32> = (0..300).collect();
        let chain = |tokens: &[u32]| crate::affinity::prefix_chain("", tokens);
        set_load(&pool, 0, 2, 0);
        set_load(&pool, 1, 0, 0);
        assert_eq!(pool.pick_for(&[], &chain(&turn1)).unwrap().url(), b);
        // The next turn follows its history to the busier replica...
        set_load(&pool, 0, 0, 0);
        set_load(&pool, 1, 5, 100 << 20);
        assert_eq!(pool.pick_for(&[], &chain(&turn2)).unwrap().url(), b);
        // ...another conversation goes to the idle one...
        let other: Vec<u32> = (1000..1200).collect();
        assert_eq!(pool.pick_for(&[], &chain(&other)).unwrap().url(), a);
        // ...and a replica far fuller than the others takes no more, prefix or not.
        set_load(&pool, 1, 5, 700 << 20);
        assert_eq!(pool.pick_for(&[], &chain(&turn2)).unwrap().url(), a);
        // A failed replica's prefixes are forgotten.
        set_load(&pool, 1, 0, 0);
        pool.failed(&pool.replicas()[0].clone());
        set_load(&pool, 0, 0, 0);
        pool.replicas()[0].member.avoid_for(Duration::ZERO);
        assert_eq!(pool.affinity.matched_tokens(a, &chain(&turn2)), 0);
    }

    #[tokio::test]
    async fn picks_the_most_free_budget_then_the_fewest_sequences() {
        let pool = pool(&["http://10.0.0.1:1", "http://10.0.0.2:1"]);
        assert!(pool.pick(&[]).is_none(), "no replica has answered yet");
        set_load(&pool, 0, 3, 600 << 20);
        set_load(&pool, 1, 1, 100 << 20);
        assert_eq!(pool.pick(&[]).unwrap().url(), "http://10.0.0.2:1");
        // Budgets within a bucket tie: the fewest sequences, counting those just placed.
        set_load(&pool, 0, 0, 0);
        set_load(&pool, 1, 0, 1 << 10);
        let picks: Vec<String> = (0..4)
            .map(|_| pool.pick(&[]).unwrap().url().to_owned())
            .collect();
        assert_eq!(
            picks.iter().filter(|u| *u == "http://10.0.0.1:1").count(),
            2,
            "{picks:?}"
        );
        // Excluded, failed and mismatched replicas are never picked.
        let first = pool.replicas()[0].clone();
        assert_eq!(
            pool.pick(&["http://10.0.0.2:1".into()]).unwrap().url(),
            first.url()
        );
        pool.failed(&first);
        assert_eq!(pool.pick(&[]).unwrap().url(), "http://10.0.0.2:1");
        pool.replicas()[1].mismatched.store(true, Ordering::Relaxed);
        pool.update_reachable();
        assert!(pool.pick(&[]).is_none());
        assert!(!*pool.reachable().borrow());
    }
}
