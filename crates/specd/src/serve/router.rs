//! `specd serve router`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use specd_core::hybrid::HYBRID_LOOKUP;
use specd_core::NgramConfig;
use specd_router::overlap::OverlapMode;
use specd_router::{
    serve, serve_http, ApiKeys, DraftSource, DrafterDns, GenerationService, PrefixCacheScope,
    RequestLimits, RouterConfig, TargetText, VerifierDns, VerifierSource,
};
use specd_wire::tls::ClientTls;

use super::listen::{bind, bind_http, shutdown_signal};
use super::ServiceArgs;

/// `--overlap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OverlapArg {
    Auto,
    On,
    Off,
}

impl OverlapArg {
    pub fn mode(self) -> OverlapMode {
        match self {
            OverlapArg::Auto => OverlapMode::Auto,
            OverlapArg::On => OverlapMode::On,
            OverlapArg::Off => OverlapMode::Off,
        }
    }
}

/// `--prefix-cache-scope`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScopeArg {
    Key,
    Global,
}

impl ScopeArg {
    pub fn scope(self) -> PrefixCacheScope {
        match self {
            ScopeArg::Key => PrefixCacheScope::Key,
            ScopeArg::Global => PrefixCacheScope::Global,
        }
    }
}

/// Drafting that runs inside the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RouterDraft {
    /// Prompt lookup (no model, no drafter service).
    Ngram,
    /// Prompt lookup while the output copies earlier text (a match of 4 tokens or more), the
    /// drafter services of --drafters / --drafter-dns for the other rounds (the default with
    /// drafter services).
    Hybrid,
    /// The drafter services alone, without the lookup.
    Drafters,
}

#[derive(Args, Debug)]
pub struct RouterArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "SPECD_LISTEN", default_value = "0.0.0.0:50050")]
    pub listen: SocketAddr,
    /// The verifier, e.g. http://verifier:50051 (one replica; see --verifiers).
    #[arg(long, env = "SPECD_VERIFIER")]
    pub verifier: Option<String>,
    /// Verifier replicas serving the same target, comma-separated, e.g.
    /// http://verifier-0:50051,http://verifier-1:50051. A request runs on the replica with
    /// the most free K/V budget and moves to another, losslessly, when its replica fails.
    #[arg(long, env = "SPECD_VERIFIERS", value_delimiter = ',')]
    pub verifiers: Vec<String>,
    /// A DNS name whose addresses are verifier replicas, host:port (a Kubernetes headless
    /// service); resolved again every --verifier-dns-refresh-secs.
    #[arg(long, env = "SPECD_VERIFIER_DNS")]
    pub verifier_dns: Option<String>,
    /// Seconds between resolutions of --verifier-dns.
    #[arg(long, env = "SPECD_VERIFIER_DNS_REFRESH_SECS", default_value_t = 10)]
    pub verifier_dns_refresh_secs: u64,
    /// Seconds a failed verifier replica is left out before it is probed back.
    #[arg(long, env = "SPECD_VERIFIER_BACKOFF_SECS", default_value_t = 10)]
    pub verifier_backoff_secs: u64,
    /// Drafter services, comma-separated, e.g. http://drafter-0:50052,http://drafter-1:50052
    /// (not with --draft ngram).
    #[arg(long, env = "SPECD_DRAFTERS", value_delimiter = ',')]
    pub drafters: Vec<String>,
    /// A DNS name whose addresses are drafter services, host:port (a Kubernetes headless
    /// service); resolved again every --drafter-dns-refresh-secs, alongside --drafters (not
    /// with --draft ngram).
    #[arg(long, env = "SPECD_DRAFTER_DNS")]
    pub drafter_dns: Option<String>,
    /// Seconds between resolutions of --drafter-dns.
    #[arg(long, env = "SPECD_DRAFTER_DNS_REFRESH_SECS", default_value_t = 10)]
    pub drafter_dns_refresh_secs: u64,
    /// Draft inside the router: `ngram` instead of drafter services, `hybrid` in front of
    /// them (the default when there are drafter services), `drafters` for the services
    /// alone.
    #[arg(long, env = "SPECD_DRAFT", value_enum)]
    pub draft: Option<RouterDraft>,
    /// Target checkpoint directory for tokenizer.json (text prompts, text output, stop
    /// strings) and the end-of-sequence ids in config.json, or a GGUF target file whose
    /// metadata holds both. Without it, clients send token ids and generation ends only at
    /// max_tokens or a stop.
    #[arg(long, env = "SPECD_TARGET")]
    pub target: Option<PathBuf>,
    /// Whether draft-model drafters pre-draft the next round while the verifier verifies
    /// this one: `auto` measures, per drafter, whether pre-drafts slow verification more
    /// than they save (a drafter on the verifier's cores starts off) and probes the other
    /// choice now and then; `on` always, `off` never. Output is the same either way.
    #[arg(long, env = "SPECD_OVERLAP", value_enum, default_value_t = OverlapArg::Auto)]
    pub overlap: OverlapArg,
    /// When pre-drafting: likely rejections a draft-model drafter also pre-drafts (the drafts
    /// accepted up to a point, then its second choice there), batched with the
    /// all-accepted pre-draft. Each holds a copy of the session's K/V on the drafter.
    #[arg(long, env = "SPECD_PREDRAFT_BRANCHES", default_value_t = 1)]
    pub predraft_branches: u32,
    /// Seconds to wait for the verifier to answer at startup.
    #[arg(long, env = "SPECD_CONNECT_TIMEOUT_SECS", default_value_t = 120)]
    pub connect_timeout_secs: u64,
    /// The CA (PEM) the verifiers' and drafters' certificates chain to: the router then
    /// calls them over TLS (https:// URLs; DNS-found members by the DNS name).
    #[arg(long, env = "SPECD_UPSTREAM_TLS_CA")]
    pub upstream_tls_ca: Option<PathBuf>,
    /// The certificate (PEM) the router presents to verifiers and drafters that require
    /// client certificates (with --upstream-tls-key).
    #[arg(long, env = "SPECD_UPSTREAM_TLS_CERT")]
    pub upstream_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --upstream-tls-cert.
    #[arg(long, env = "SPECD_UPSTREAM_TLS_KEY")]
    pub upstream_tls_key: Option<PathBuf>,
    /// Largest K/V snapshot the router holds for one request (an MTP drafter's Open), in
    /// bytes; a larger one ends that request's speculation.
    #[arg(long, env = "SPECD_MAX_SNAPSHOT_BYTES", default_value_t = 1 << 30)]
    pub max_snapshot_bytes: usize,
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(flatten)]
    pub service: ServiceArgs,
}

/// The public API's settings, shared by the router and the one-process server.
#[derive(Args, Debug)]
pub struct ApiArgs {
    /// Also serve the OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions,
    /// /v1/models, /health) on this address, e.g. 0.0.0.0:8000 (port 0 picks a free port).
    #[arg(long, env = "SPECD_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,
    /// The model name HTTP clients send and /v1/models lists (default: the verifier's
    /// model name, its checkpoint's file or directory name).
    #[arg(long, env = "SPECD_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    /// Block size of the adaptive policy (a drafter's trained depth).
    #[arg(long, env = "SPECD_BLOCK_SIZE", default_value_t = 4)]
    pub block_size: usize,
    /// Largest block size, for requests and the adaptive policy.
    #[arg(long, env = "SPECD_MAX_BLOCK_SIZE", default_value_t = 8)]
    pub max_block_size: usize,
    /// Drafts a round may verify beside its chain as a token tree (0: chains only), where
    /// the verifiers say they verify trees and a draft model or an MTP assistant drafts, in
    /// this process or as drafter services (a tree round is not pre-drafted);
    /// each request measures whether trees or chains cost less per token and uses the
    /// cheaper.
    #[arg(long, env = "SPECD_TREE_NODES", default_value_t = 3, value_parser = clap::value_parser!(u64).range(0..=8))]
    pub tree_nodes: u64,
    /// Tokens generated when a request leaves max_tokens unset.
    #[arg(long, env = "SPECD_DEFAULT_MAX_TOKENS", default_value_t = 256)]
    pub default_max_tokens: u32,
    /// Requests running at once; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "SPECD_MAX_CONCURRENT_REQUESTS", default_value_t = 64)]
    pub max_concurrent_requests: usize,
    /// Tokens all running requests verify per round together: under load each request's
    /// block size is capped to its share (0: no cap).
    #[arg(long, env = "SPECD_MAX_BATCH_TOKENS", default_value_t = 32)]
    pub max_batch_tokens: usize,
    /// API keys, one per line, optionally `name:key`: clients must send
    /// `authorization: Bearer KEY` (gRPC metadata or HTTP header). Health stays open.
    #[arg(long, env = "SPECD_API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,
    /// Requests one API key may run at once (0: only --max-concurrent-requests limits).
    #[arg(long, env = "SPECD_MAX_REQUESTS_PER_KEY", default_value_t = 0)]
    pub max_requests_per_key: usize,
    /// Which requests share cached prompt prefixes on the verifiers: `key`, only requests
    /// of one API key (all requests when the API is open); `global`, every request. A
    /// request's `cache_salt` narrows either further.
    #[arg(long, env = "SPECD_PREFIX_CACHE_SCOPE", value_enum, default_value_t = ScopeArg::Key)]
    pub prefix_cache_scope: ScopeArg,
    #[command(flatten)]
    pub requests: RequestLimitArgs,
}

impl ApiArgs {
    /// The router's settings of these flags; `overlap` and `upstream_tls` as given.
    pub fn config(
        &self,
        service: &ServiceArgs,
        overlap: OverlapMode,
        predraft_branches: u32,
        max_snapshot_bytes: usize,
        upstream_tls: Option<ClientTls>,
    ) -> Result<RouterConfig> {
        if self.max_concurrent_requests == 0 {
            anyhow::bail!("--max-concurrent-requests: must be at least 1");
        }
        Ok(RouterConfig {
            limits: service.limits.limits()?,
            default_max_tokens: self.default_max_tokens,
            block_size: self.block_size.max(1),
            max_block_size: self.max_block_size.max(1),
            tree_nodes: self.tree_nodes as usize,
            max_concurrent_requests: self.max_concurrent_requests,
            max_batch_tokens: self.max_batch_tokens,
            overlap,
            predraft_branches,
            requests: self.requests.limits()?,
            max_snapshot_bytes,
            api_keys: match &self.api_keys_file {
                Some(path) => Some(Arc::new(ApiKeys::load(path, self.max_requests_per_key)?)),
                None if self.max_requests_per_key > 0 => {
                    bail!("--max-requests-per-key needs --api-keys-file")
                }
                None => None,
            },
            serving: service.listener.options()?,
            prefix_cache_scope: self.prefix_cache_scope.scope(),
            upstream_tls,
        })
    }
}

/// Serves the Generation API of `service` on `listen` (and the OpenAI API on the API's
/// `--http-listen`) until SIGINT or SIGTERM; both drain their running requests.
pub async fn serve_api(
    service: GenerationService,
    listen: SocketAddr,
    api: &ApiArgs,
) -> Result<()> {
    let http = match api.http_listen {
        Some(addr) => Some(bind_http(addr).await?),
        None => None,
    };
    let incoming = bind(listen, "router")?;
    // One signal stops both servers; each drains its running requests.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    });
    let when_stopped = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }
    };
    let grpc = serve(service.clone(), incoming, when_stopped());
    match http {
        Some(listener) => {
            let name = api.served_model_name.clone();
            let http = serve_http(service, listener, name, when_stopped());
            let (grpc, http) = tokio::join!(grpc, http);
            grpc?;
            http.context("serving HTTP")?;
        }
        None => grpc.await?,
    }
    Ok(())
}

/// What one request may ask of the router.
#[derive(Args, Debug)]
pub struct RequestLimitArgs {
    /// Bytes of prompt text or chat messages a request may send (checked before
    /// tokenization).
    #[arg(long, env = "SPECD_MAX_PROMPT_BYTES", default_value_t = 1 << 20)]
    pub max_prompt_bytes: usize,
    /// Largest max_tokens a request may ask for.
    #[arg(long, env = "SPECD_MAX_TOKENS_LIMIT", default_value_t = 32_768)]
    pub max_tokens_limit: u32,
    /// Stop strings per request.
    #[arg(long, env = "SPECD_MAX_STOP_STRINGS", default_value_t = 16)]
    pub max_stop_strings: usize,
    /// Bytes of one stop string.
    #[arg(long, env = "SPECD_MAX_STOP_STRING_BYTES", default_value_t = 256)]
    pub max_stop_string_bytes: usize,
    /// Seconds one request may run (0: no limit).
    #[arg(long, env = "SPECD_MAX_REQUEST_SECS", default_value_t = 1800)]
    pub max_request_secs: u64,
    /// A streaming client that reads nothing for this many seconds is dropped and its
    /// request's place freed (0: wait forever).
    #[arg(long, env = "SPECD_STREAM_STALL_TIMEOUT_SECS", default_value_t = 60)]
    pub stream_stall_timeout_secs: u64,
    /// Prompts tokenized at once, off the serving threads (default: one per core).
    #[arg(long, env = "SPECD_TOKENIZER_THREADS")]
    pub tokenizer_threads: Option<usize>,
}

impl RequestLimitArgs {
    fn limits(&self) -> Result<RequestLimits> {
        let secs = |s: u64| (s > 0).then(|| Duration::from_secs(s));
        let defaults = RequestLimits::default();
        let tokenizer_threads = self.tokenizer_threads.unwrap_or(defaults.tokenizer_threads);
        if tokenizer_threads == 0 {
            bail!("--tokenizer-threads: must be at least 1");
        }
        Ok(RequestLimits {
            max_prompt_bytes: self.max_prompt_bytes,
            max_tokens: self.max_tokens_limit,
            max_stop_strings: self.max_stop_strings,
            max_stop_string_bytes: self.max_stop_string_bytes,
            max_duration: secs(self.max_request_secs),
            stream_stall_timeout: secs(self.stream_stall_timeout_secs),
            tokenizer_threads,
        })
    }
}

/// Where drafts come from, as the drafting flags say.
fn draft_source(args: &RouterArgs) -> Result<DraftSource> {
    let dns = args.drafter_dns.as_ref().map(|name| DrafterDns {
        name: name.clone(),
        refresh: Duration::from_secs(args.drafter_dns_refresh_secs),
    });
    let has_services = dns.is_some() || !args.drafters.is_empty();
    Ok(match (args.draft, dns) {
        (Some(RouterDraft::Ngram), _) if has_services => {
            bail!(
                "--draft ngram drafts without drafter services: drop --drafters and \
                 --drafter-dns, or use --draft hybrid"
            )
        }
        (Some(RouterDraft::Ngram), _) => DraftSource::Ngram(NgramConfig::default()),
        (Some(kind @ (RouterDraft::Hybrid | RouterDraft::Drafters)), _) if !has_services => {
            let name = if kind == RouterDraft::Hybrid {
                "hybrid"
            } else {
                "drafters"
            };
            bail!("--draft {name} needs drafter services: give --drafters or --drafter-dns")
        }
        (Some(RouterDraft::Drafters), Some(dns)) => DraftSource::Discovered {
            urls: args.drafters.clone(),
            dns,
        },
        (Some(RouterDraft::Drafters), None) => DraftSource::Remote(args.drafters.clone()),
        // Lookup in front of the services unless asked otherwise: it never loses, and rounds
        // that copy earlier text (edits, quotes, repeated code) cost no drafter call.
        (None | Some(RouterDraft::Hybrid), dns) if has_services => DraftSource::Hybrid {
            urls: args.drafters.clone(),
            dns,
            lookup: HYBRID_LOOKUP,
        },
        (None | Some(RouterDraft::Hybrid), _) => DraftSource::None,
    })
}

/// Where the verifier replicas are, as the verifier flags say.
fn verifier_source(args: &RouterArgs) -> Result<VerifierSource> {
    let mut urls: Vec<String> = args.verifier.iter().cloned().collect();
    urls.extend(args.verifiers.iter().cloned());
    let dns = args.verifier_dns.as_ref().map(|name| VerifierDns {
        name: name.clone(),
        refresh: Duration::from_secs(args.verifier_dns_refresh_secs),
    });
    if urls.is_empty() && dns.is_none() {
        bail!("no verifier: give --verifier, --verifiers or --verifier-dns");
    }
    Ok(VerifierSource {
        urls,
        dns,
        backoff: Duration::from_secs(args.verifier_backoff_secs),
    })
}

pub async fn run(args: RouterArgs) -> Result<()> {
    let source = draft_source(&args)?;
    let text = match &args.target {
        Some(path) => TargetText::load(path)
            .with_context(|| format!("reading the target's text files at {}", path.display()))?,
        None => TargetText::without_tokenizer(Vec::new()),
    };
    let upstream_tls = ClientTls::from_files(
        args.upstream_tls_ca.as_deref(),
        args.upstream_tls_cert.as_deref(),
        args.upstream_tls_key.as_deref(),
        [
            "--upstream-tls-ca",
            "--upstream-tls-cert",
            "--upstream-tls-key",
        ],
    )?;
    let config = args.api.config(
        &args.service,
        args.overlap.mode(),
        args.predraft_branches,
        args.max_snapshot_bytes,
        upstream_tls,
    )?;
    let service = GenerationService::connect(
        &verifier_source(&args)?,
        &source,
        text,
        config,
        Duration::from_secs(args.connect_timeout_secs),
    )
    .await?;
    serve_api(service, args.listen, &args.api).await
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: RouterArgs,
    }

    fn source(flags: &[&str]) -> Result<DraftSource> {
        let mut argv = vec!["router", "--verifier", "http://127.0.0.1:1"];
        argv.extend_from_slice(flags);
        draft_source(&Cli::try_parse_from(argv)?.args)
    }

    #[test]
    fn drafting_flags_pick_the_source() {
        assert!(matches!(source(&[]).unwrap(), DraftSource::None));
        assert!(matches!(
            source(&["--draft", "ngram"]).unwrap(),
            DraftSource::Ngram(_)
        ));
        let alone = ["--draft", "drafters", "--drafters", "http://d:1,http://e:1"];
        assert!(matches!(
            source(&alone).unwrap(),
            DraftSource::Remote(urls) if urls.len() == 2
        ));
        assert!(matches!(
            source(&["--draft", "drafters", "--drafter-dns", "drafters:50052"]).unwrap(),
            DraftSource::Discovered { .. }
        ));
        // With drafter services, hybrid is the default.
        for flags in [
            &["--drafters", "http://d:1"][..],
            &["--draft", "hybrid", "--drafters", "http://d:1"],
        ] {
            assert!(matches!(
                source(flags).unwrap(),
                DraftSource::Hybrid { urls, dns: None, lookup }
                    if urls == ["http://d:1"] && lookup == HYBRID_LOOKUP
            ));
        }
        for flags in [
            &["--drafter-dns", "drafters:50052"][..],
            &["--draft", "hybrid", "--drafter-dns", "drafters:50052"],
        ] {
            assert!(matches!(
                source(flags).unwrap(),
                DraftSource::Hybrid { urls, dns: Some(dns), .. }
                    if urls.is_empty() && dns.name == "drafters:50052"
            ));
        }
    }

    #[test]
    fn contradicting_drafting_flags_are_refused() {
        let err = source(&["--draft", "ngram", "--drafters", "http://d:1"]).unwrap_err();
        assert!(err.to_string().contains("--draft hybrid"), "{err}");
        let err = source(&["--draft", "hybrid"]).unwrap_err();
        assert!(err.to_string().contains("--drafters"), "{err}");
        let err = source(&["--draft", "drafters"]).unwrap_err();
        assert!(err.to_string().contains("--draft drafters needs"), "{err}");
    }
}
