//! Pools whose members a DNS name lists (a Kubernetes headless service): resolving the name,
//! again and again, and merging what it says into the pool.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tracing::{info, warn};

/// A pool member known by URL, configured or found through DNS.
pub(crate) trait Member {
    fn url(&self) -> &str;
    /// Came from DNS, so a later resolution that lacks it removes it.
    fn discovered(&self) -> bool;
}

/// The URLs (`scheme://addr`) `name` (`host:port`) resolves to, sorted; `None` when the
/// resolution failed.
pub(crate) async fn resolve(
    name: &str,
    what: &'static str,
    scheme: &'static str,
) -> Option<Vec<String>> {
    match tokio::net::lookup_host(name).await {
        Ok(addrs) => {
            let mut urls: Vec<String> = addrs.map(|addr| format!("{scheme}://{addr}")).collect();
            urls.sort();
            urls.dedup();
            Some(urls)
        }
        Err(error) => {
            warn!(%name, %error, "resolving {what} failed");
            None
        }
    }
}

/// Replaces the discovered members of `members` with `urls`, keeping those already known
/// (and their state); configured members stay whatever DNS says.
pub(crate) fn replace_discovered<T: Member, E: std::fmt::Display>(
    members: &mut Vec<Arc<T>>,
    urls: &[String],
    make: impl Fn(&str) -> Result<T, E>,
    what: &'static str,
) {
    let before = members.len();
    members.retain(|m| !m.discovered() || urls.iter().any(|url| url == m.url()));
    let removed = before - members.len();
    let mut added = 0;
    for url in urls {
        if members.iter().any(|m| m.url() == url) {
            continue;
        }
        match make(url) {
            Ok(member) => {
                members.push(Arc::new(member));
                added += 1;
            }
            Err(error) => warn!(%error, "skipping a discovered {what}"),
        }
    }
    if added + removed > 0 {
        info!(added, removed, total = members.len(), "{what} pool changed");
    }
}

/// Resolves `name` every `refresh` and hands the URLs to `apply`, until the pool is dropped.
/// A failed resolution keeps the members of the last one.
pub(crate) async fn resolve_periodically<P>(
    pool: Weak<P>,
    name: String,
    refresh: Duration,
    what: &'static str,
    scheme: &'static str,
    apply: fn(&P, &[String]),
) {
    loop {
        if let Some(urls) = resolve(&name, what, scheme).await {
            let Some(pool) = pool.upgrade() else { return };
            apply(&pool, &urls);
        }
        tokio::time::sleep(refresh.max(Duration::from_millis(100))).await;
        if pool.strong_count() == 0 {
            return;
        }
    }
}
