//! What a verifier replica and a drafter endpoint share as members of their pools: the URL,
//! the client dialled once, where the URL came from, and the backoff after a failure.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use specd_core::sync::lock;
use tonic::transport::Channel;

use crate::upstream::Upstream;

pub(crate) struct PoolMember<C> {
    url: String,
    client: C,
    /// Left out of picks until then, after a failure.
    avoid_until: Mutex<Option<Instant>>,
    /// Came from DNS, so a later resolution that lacks it removes it.
    discovered: bool,
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

    /// Keeps it out of picks for `backoff` from now.
    pub fn avoid_for(&self, backoff: Duration) {
        *lock(&self.avoid_until) = Some(Instant::now() + backoff);
    }

    /// Ends a backoff that has run out; true when there was one.
    pub fn recovered(&self) -> bool {
        lock(&self.avoid_until).take().is_some()
    }
}
