//! How the router dials its verifiers and drafters: message limits, and TLS with the
//! certificate the router presents to services that require one.

use specd_wire::limits::MessageLimits;
use specd_wire::tls::{secure_endpoint, ClientTls};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// Pings on every connection to a verifier or drafter this often.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// A ping unanswered this long closes the connection.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The router's side of every connection to a verifier or drafter.
#[derive(Debug, Clone, Default)]
pub struct Upstream {
    pub limits: MessageLimits,
    /// `None`: plaintext (`http://` URLs only).
    pub tls: Option<ClientTls>,
}

impl Upstream {
    /// The scheme of URLs found through DNS.
    pub(crate) fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// A lazily connecting channel to `url`. `server_name` is the name the server's
    /// certificate must carry when `url` holds an address instead (members found through
    /// DNS); by default it is the URL's host.
    pub(crate) fn channel(&self, url: &str, server_name: Option<&str>) -> Result<Channel, String> {
        let endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|e| e.to_string())?
            // A verifier or drafter that vanished without closing its connections is noticed
            // by the pings, so the requests on it move or fall back instead of hanging.
            .http2_keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let endpoint = secure_endpoint(
            endpoint,
            self.tls.as_ref(),
            server_name,
            "--upstream-tls-ca",
        )
        .map_err(|e| e.to_string())?;
        Ok(endpoint.connect_lazy())
    }
}

/// The host part of a `host:port` DNS name, which discovered members' certificates name.
pub(crate) fn dns_host(name: &str) -> Option<String> {
    name.rsplit_once(':').map(|(host, _)| host.to_owned())
}
