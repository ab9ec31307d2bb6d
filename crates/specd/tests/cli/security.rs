//! TLS, mutual TLS and API keys on real `specd serve` processes, with certificates made for
//! the test: the router reaches its verifier and drafter only with its client certificate,
//! clients reach the router only over TLS and with a known key, and speculation stays
//! lossless through it all. A stalled stream gives its place back.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::served::certs::Pki;
use crate::served::{fixture, request, Service};
use specd_wire::generation::{GenerateRequest, GenerationClient};
use specd_wire::verifier::{VerifierClient, VerifierStatsRequest};
use tokio_rustls::rustls;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;

const ALICE: &str = "sk-alice-0123456789abcdef";
const BOB: &str = "sk-bob-0123456789abcdef01";
const PROMPT: [u32; 5] = [2, 40, 41, 42, 43];

fn s(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Verifier and drafter requiring client certificates, and a router serving TLS with API
/// keys (one request at a time per key) in front of them.
struct Secured {
    pki: Pki,
    verifier: Service,
    _drafter: Service,
    router: Service,
    http: String,
}

impl Secured {
    fn start() -> Self {
        let pki = Pki::generate("secured");
        let keys = pki.dir.join("api-keys");
        std::fs::write(&keys, format!("# test keys\nalice:{ALICE}\nbob:{BOB}\n")).unwrap();
        let target = s(&fixture("target-full"));
        let (cert, key, ca) = (s(&pki.server_cert), s(&pki.server_key), s(&pki.ca));
        let mutual = [
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-client-ca",
            &ca,
        ];
        let mut args = vec!["verifier", "--target", &target];
        args.extend(mutual);
        let verifier = Service::start(&args);
        let assistant = s(&fixture("assistant-dense"));
        let mut args = vec!["drafter", "--drafter", &assistant, "--target", &target];
        args.extend(mutual);
        let drafter = Service::start(&args);
        let (verifier_url, drafter_url) = (verifier.https_url(), drafter.https_url());
        let (client_cert, client_key) = (s(&pki.client_cert), s(&pki.client_key));
        let keys = s(&keys);
        let (router, http) = Service::router_with_http(&[
            "--verifier",
            &verifier_url,
            "--drafters",
            &drafter_url,
            "--draft",
            "drafters",
            "--target",
            &target,
            "--upstream-tls-ca",
            &ca,
            "--upstream-tls-cert",
            &client_cert,
            "--upstream-tls-key",
            &client_key,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--api-keys-file",
            &keys,
            "--max-requests-per-key",
            "1",
            "--no-reflection",
        ]);
        Self {
            pki,
            verifier,
            _drafter: drafter,
            router,
            http,
        }
    }

    /// A client of the router over TLS.
    async fn client(&self) -> GenerationClient<Channel> {
        GenerationClient::new(
            tls_channel(&self.router.https_url(), &self.pki.ca, None)
                .await
                .unwrap(),
        )
    }
}

/// A TLS channel to `url` trusting `ca`, presenting `identity` (certificate, key) if given.
async fn tls_channel(
    url: &str,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(Pki::read(ca)));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(Pki::read(cert), Pki::read(key)));
    }
    Endpoint::from_shared(url.to_owned())
        .unwrap()
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

fn with_key(message: GenerateRequest, key: Option<&str>) -> tonic::Request<GenerateRequest> {
    let mut request = tonic::Request::new(message);
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_api_keys_guard_every_hop_and_speculation_stays_lossless() {
    let stack = Secured::start();
    let mut client = stack.client().await;
    let plain = client
        .generate(with_key(request(&PROMPT, 48, 0), Some(ALICE)))
        .await
        .unwrap()
        .into_inner();
    let speculative = client
        .generate(with_key(request(&PROMPT, 48, 4), Some(BOB)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plain.token_ids.len(), 48);
    assert_eq!(speculative.token_ids, plain.token_ids);
    let stats = speculative.stats.unwrap();
    assert!(stats.drafted > 0, "the drafter over mutual TLS drafted");

    for key in [None, Some("sk-wrong-0123456789abcdef")] {
        let err = client
            .generate(with_key(request(&PROMPT, 4, 0), key))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{key:?}: {err}");
        assert!(err.message().starts_with("authorization"), "{err}");
    }

    // Plaintext never reaches the router.
    let plaintext = format!("http://{}", stack.router.addr());
    let refused = match Channel::from_shared(plaintext).unwrap().connect().await {
        Err(_) => true,
        Ok(channel) => GenerationClient::new(channel)
            .generate(with_key(request(&PROMPT, 4, 0), Some(ALICE)))
            .await
            .is_err(),
    };
    assert!(refused, "a plaintext client was served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_services_take_only_clients_with_a_certificate_of_their_ca() {
    let stack = Secured::start();
    let url = stack.verifier.https_url();
    let stats = |channel: Channel| async move {
        VerifierClient::new(channel)
            .stats(VerifierStatsRequest {})
            .await
    };
    // No client certificate: the handshake or the first call fails.
    if let Ok(channel) = tls_channel(&url, &stack.pki.ca, None).await {
        assert!(
            stats(channel).await.is_err(),
            "served without a certificate"
        );
    }
    // A certificate of another CA.
    let stranger = Pki::generate("stranger");
    let identity = Some((
        stranger.client_cert.as_path(),
        stranger.client_key.as_path(),
    ));
    if let Ok(channel) = tls_channel(&url, &stack.pki.ca, identity).await {
        assert!(
            stats(channel).await.is_err(),
            "served another CA's certificate"
        );
    }
    // The router's certificate.
    let identity = Some((
        stack.pki.client_cert.as_path(),
        stack.pki.client_key.as_path(),
    ));
    let channel = tls_channel(&url, &stack.pki.ca, identity).await.unwrap();
    assert!(stats(channel).await.is_ok());

    // Health probes speak TLS too, presenting a certificate where one is required.
    let health = |addr: &str, extra: &[&Path]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_specd"));
        command
            .args(["health", "--addr", addr, "--tls-ca"])
            .arg(&stack.pki.ca);
        if let [cert, key] = extra {
            command
                .arg("--tls-cert")
                .arg(cert)
                .arg("--tls-key")
                .arg(key);
        }
        command.output().unwrap().status.success()
    };
    assert!(health(&stack.router.https_url(), &[]));
    assert!(!health(&url, &[]));
    // --tls-server-name is the name checked, whatever the address says.
    let named = |name: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_specd"))
            .args(["health", "--addr", &stack.router.https_url(), "--tls-ca"])
            .arg(&stack.pki.ca)
            .args(["--tls-server-name", name])
            .output()
            .unwrap()
            .status
            .success()
    };
    assert!(named("127.0.0.1"));
    assert!(!named("drafter"));
    assert!(health(
        &url,
        &[&stack.pki.server_cert, &stack.pki.server_key]
    ));
}

/// POSTs `body` to the router's HTTPS API; the status line's code.
async fn https_post(stack: &Secured, path: &str, key: Option<&str>, body: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&stack.pki.ca).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(&stack.http).await.unwrap();
    let mut tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let authorization = key.map_or(String::new(), |key| {
        format!("authorization: Bearer {key}\r\n")
    });
    let message = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         {authorization}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(message.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    answer.split(' ').nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_serves_tls_and_checks_keys() {
    let stack = Secured::start();
    let body = r#"{"prompt": [2, 40, 41], "max_tokens": 4}"#;
    assert_eq!(
        https_post(&stack, "/v1/completions", Some(ALICE), body).await,
        200
    );
    assert_eq!(https_post(&stack, "/v1/completions", None, body).await, 401);
    assert_eq!(
        https_post(
            &stack,
            "/v1/completions",
            Some("sk-wrong-0123456789abcdef"),
            body
        )
        .await,
        401
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_runs_at_most_its_limit_of_requests() {
    let stack = Secured::start();
    let client = stack.client().await;
    let mut running = client
        .clone()
        .generate_stream(with_key(request(&PROMPT, 900, 4), Some(ALICE)))
        .await
        .unwrap()
        .into_inner();
    running.message().await.unwrap().unwrap();
    let err = client
        .clone()
        .generate(with_key(request(&PROMPT, 4, 0), Some(ALICE)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("\"alice\""), "{err}");
    assert!(!err.message().contains(ALICE), "the key leaked: {err}");
    // Another key is not held back.
    client
        .clone()
        .generate(with_key(request(&PROMPT, 4, 0), Some(BOB)))
        .await
        .unwrap();
    while running.message().await.unwrap().is_some() {}
    client
        .clone()
        .generate(with_key(request(&PROMPT, 4, 0), Some(ALICE)))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_its_client_stopped_reading_gives_its_place_back() {
    let verifier = Service::verifier();
    let router = Service::router(
        &verifier,
        &[],
        &[
            "--stream-stall-timeout-secs",
            "1",
            "--max-concurrent-requests",
            "1",
        ],
    );
    // A receive window of a few messages: the router can send little before it must wait.
    let stalled_channel = Endpoint::from_shared(router.url.clone())
        .unwrap()
        .initial_stream_window_size(Some(64))
        .initial_connection_window_size(Some(64))
        .connect()
        .await
        .unwrap();
    let mut stalled = GenerationClient::new(stalled_channel);
    let stream = stalled
        .generate_stream(request(&PROMPT, 900, 0))
        .await
        .unwrap()
        .into_inner();
    let mut client = GenerationClient::new(router.channel().await);
    let busy = client.generate(request(&PROMPT, 4, 0)).await.unwrap_err();
    assert_eq!(busy.code(), Code::ResourceExhausted, "{busy}");
    // The stalled request ends once it waited a second for its reader.
    let mut served = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        match client.generate(request(&PROMPT, 4, 0)).await {
            Ok(answer) => {
                served = Some(answer.into_inner());
                break;
            }
            Err(status) => assert_eq!(status.code(), Code::ResourceExhausted, "{status}"),
        }
    }
    assert_eq!(
        served
            .expect("the stalled stream kept its place")
            .token_ids
            .len(),
        4
    );
    let mut left = verifier.live_sequences().await;
    for _ in 0..100 {
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = verifier.live_sequences().await;
    }
    assert_eq!(left, 0, "the stalled request's sequence was not freed");
    drop(stream);
}
