//! What a verifier replica and a drafter endpoint share as members of their pools: the URL,
//! the client dialled once, where the URL came from, and the backoff after a failure.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use specd_core::sync::lock;
use tonic::transport::Channel;
use tracing::{debug, info, warn};

use crate::upstream::Upstream;

pub(crate) struct PoolMember<C> {
    url: String,
    client: C,
    /// Left out of picks until then, after a failure.
    avoid_until: Mutex<Option<Instant>>,
    /// Came from DNS, so a later resolution that lacks it removes it.
    discovered: bool,
    /// Failed since it last answered: its outage is logged once, not at every retry (a
    /// member that is down for long is retried after each backoff).
    failing: AtomicBool,
}

impl<C: Clone> PoolMember<C> {
    /// A member at `url` whose client `make` builds over the upstream channel.
    /// `server_name`: the name a discovered member's certificate carries (its DNS name);
    /// `None` for configured URLs. The error is why the URL cannot be dialled.
    pub fn connect(
        url: &str,
        upstream: &Upstream,
        server_name: Option<&str>,
        make: impl FnOnce(Channel) -> C,
    ) -> Result<Self, String> {
        let channel = upstream.channel(url, server_name)?;
        Ok(Self {
            url: url.to_owned(),
            client: make(channel),
            avoid_until: Mutex::new(None),
            discovered: server_name.is_some(),
            failing: AtomicBool::new(false),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn client(&self) -> C {
        self.client.clone()
    }

    pub fn discovered(&self) -> bool {
        self.discovered
    }

    /// Whether a failure still keeps it out of picks at `now`.
    pub fn backing_off(&self, now: Instant) -> bool {
        lock(&self.avoid_until).is_some_and(|until| now < until)
    }

    /// A failure: out of picks for `backoff` from now. `what` (`drafter`, `verifier`) names
    /// it in the log: the first failure of an outage is a warning, the retries that fail
    /// while it stays down are logged at debug.
    pub fn fail(&self, backoff: Duration, what: &'static str) {
        if self.note_failure() {
            warn!(url = %self.url, ?backoff, "{what} failed; avoiding it");
        } else {
            debug!(url = %self.url, ?backoff, "{what} still failing; avoiding it");
        }
        self.avoid_for(backoff);
    }

    /// Keeps it out of picks for `backoff` from now.
    pub fn avoid_for(&self, backoff: Duration) {
        *lock(&self.avoid_until) = Some(Instant::now() + backoff);
    }

    /// Records an answer; the one that ends an outage is logged.
    pub fn answered(&self, what: &'static str) {
        if self.note_answer() {
            info!(url = %self.url, "{what} answers again; taking work");
        }
    }

    /// Whether it failed since it last answered.
    pub fn failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    /// Records a failure; true for the first since it last answered (the one to log).
    fn note_failure(&self) -> bool {
        !self.failing.swap(true, Ordering::Relaxed)
    }

    /// Records an answer; true when it had been failing (the recovery to log).
    fn note_answer(&self) -> bool {
        self.failing.swap(false, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_outage_is_reported_once_and_so_is_its_end() {
        let member =
            PoolMember::connect("http://127.0.0.1:9", &Upstream::default(), None, |c| c).unwrap();
        assert!(!member.failing());
        assert!(member.note_failure(), "the first failure is the one to log");
        assert!(
            !member.note_failure(),
            "later failures of the same outage are not"
        );
        assert!(member.failing());
        assert!(member.note_answer(), "the first answer ends the outage");
        assert!(!member.note_answer());
        assert!(member.note_failure(), "a new outage is logged again");
    }
}
