//! `specd serve ...` processes for the failover and drain tests: started on free ports,
//! signalled and killed like an operator or an orchestrator would.
#![allow(dead_code)]

pub mod certs;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};

use specd_wire::drafter::{DrafterClient, DrafterStatsRequest};
use specd_wire::generation::{
    generate_request, GenerateRequest, GenerateStreamResponse, SamplingParams, SpeculativeParams,
    TokenIds,
};
use specd_wire::verifier::{VerifierClient, VerifierStatsRequest};
use tonic::transport::Channel;
use tonic::Streaming;

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/gemma4")
        .join(name)
}

fn path(p: PathBuf) -> String {
    p.to_string_lossy().into_owned()
}

/// A service process, killed when dropped.
pub struct Service {
    child: Child,
    pub url: String,
}

impl Service {
    /// Starts `specd serve <args>` on a free port and waits for its `listening on` line.
    pub fn start(args: &[&str]) -> Self {
        Self::start_on(args, "127.0.0.1:0")
    }

    /// Starts `specd serve <args>` listening on `addr` (a restart on a known port).
    pub fn start_on(args: &[&str], addr: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_specd"))
            .arg("serve")
            .args(args)
            .args(["--listen", addr])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?} from {args:?}"))
            .to_owned();
        Self {
            child,
            url: format!("http://{addr}"),
        }
    }

    /// Starts `specd serve router <args>` with its HTTP API on a free port too; the HTTP
    /// address comes back beside the service.
    pub fn router_with_http(args: &[&str]) -> (Self, String) {
        Self::with_http(&["router"], args)
    }

    /// Starts `specd serve <args>` (router, verifier and drafter in one process) with its
    /// HTTP API on a free port too.
    pub fn one_process(args: &[&str]) -> (Self, String) {
        Self::with_http(&[], args)
    }

    /// [`Self::one_process`] with its Prometheus endpoint on a free port too, whose address
    /// comes back last.
    pub fn one_process_with_metrics(args: &[&str]) -> (Self, String, String) {
        let (service, http, metrics) = Self::spawn_with_http(&[], args, true);
        (service, http, metrics.unwrap_or_default())
    }

    fn with_http(service: &[&str], args: &[&str]) -> (Self, String) {
        let (service, http, _) = Self::spawn_with_http(service, args, false);
        (service, http)
    }

    fn spawn_with_http(
        service: &[&str],
        args: &[&str],
        metrics: bool,
    ) -> (Self, String, Option<String>) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_specd"));
        command.arg("serve").args(service).args(args).args([
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ]);
        if metrics {
            command.args(["--metrics-listen", "127.0.0.1:0"]);
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut read = |prefix: &str| {
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            line.trim()
                .strip_prefix(prefix)
                .unwrap_or_else(|| panic!("expected {prefix:?}, read {line:?}"))
                .to_owned()
        };
        let metrics = metrics.then(|| read("metrics listening on "));
        let http = read("http listening on ");
        let addr = read("listening on ");
        let service = Self {
            child,
            url: format!("http://{addr}"),
        };
        (service, http, metrics)
    }

    pub fn verifier() -> Self {
        Self::start(&["verifier", "--target", &path(fixture("target-full"))])
    }

    /// The verifier of the tiny target on `addr`.
    pub fn verifier_on(addr: &str) -> Self {
        Self::start_on(
            &["verifier", "--target", &path(fixture("target-full"))],
            addr,
        )
    }

    /// `host:port` of the service.
    pub fn addr(&self) -> &str {
        self.url.trim_start_matches("http://")
    }

    /// The service's URL when it serves TLS with a certificate for localhost.
    pub fn https_url(&self) -> String {
        let port = self.addr().rsplit_once(':').unwrap().1;
        format!("https://localhost:{port}")
    }

    /// A router over the verifier replicas `verifiers` and the drafters `drafters`.
    pub fn router_over(verifiers: &[&Service], drafters: &[&Service], extra: &[&str]) -> Self {
        let join = |services: &[&Service]| {
            let urls: Vec<&str> = services.iter().map(|s| s.url.as_str()).collect();
            urls.join(",")
        };
        let (verifiers, drafters_urls) = (join(verifiers), join(drafters));
        let target = path(fixture("target-full"));
        let mut args = vec!["router", "--verifiers", &verifiers, "--target", &target];
        if !drafters.is_empty() {
            args.extend(["--drafters", &drafters_urls]);
        }
        args.extend(
            services_alone(!drafters.is_empty(), extra)
                .into_iter()
                .flatten(),
        );
        args.extend(extra);
        Self::start(&args)
    }

    pub fn mtp_drafter() -> Self {
        Self::start(&[
            "drafter",
            "--drafter",
            &path(fixture("assistant-dense")),
            "--target",
            &path(fixture("target-full")),
        ])
    }

    /// A router over `verifier` and the drafters at `drafters`, with `extra` flags.
    pub fn router(verifier: &Service, drafters: &[&Service], extra: &[&str]) -> Self {
        let urls: Vec<&str> = drafters.iter().map(|d| d.url.as_str()).collect();
        let urls = urls.join(",");
        let target = path(fixture("target-full"));
        let mut args = vec!["router", "--verifier", &verifier.url, "--target", &target];
        if !drafters.is_empty() {
            args.extend(["--drafters", &urls]);
        }
        args.extend(
            services_alone(!drafters.is_empty(), extra)
                .into_iter()
                .flatten(),
        );
        args.extend(extra);
        Self::start(&args)
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// Kills the process outright, as a crash or an evicted pod would end.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Sends SIGTERM, as an orchestrator stopping the process does.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit on its own.
    pub fn wait(&mut self) -> ExitStatus {
        self.child.wait().unwrap()
    }

    pub async fn live_sequences(&self) -> u32 {
        VerifierClient::new(self.channel().await)
            .stats(VerifierStatsRequest {})
            .await
            .unwrap()
            .into_inner()
            .live_sequences
    }

    pub async fn live_sessions(&self) -> u32 {
        DrafterClient::new(self.channel().await)
            .stats(DrafterStatsRequest {})
            .await
            .unwrap()
            .into_inner()
            .live_sessions
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// POSTs JSON to `path` over plain HTTP/1.1 (`connection: close`); the status and the body.
pub fn http_post(addr: &str, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    use std::io::{Read, Write};
    let body = body.to_string();
    let mut socket = std::net::TcpStream::connect(addr).unwrap();
    write!(
        socket,
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    socket.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap())
}

/// A greedy request of `max_tokens` from a small prompt, speculating with `block_size`
/// (speculation off when 0).
pub fn request(prompt: &[u32], max_tokens: u32, block_size: u32) -> GenerateRequest {
    GenerateRequest {
        input: Some(generate_request::Input::PromptIds(TokenIds {
            ids: prompt.to_vec(),
        })),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        sampling: Some(SamplingParams {
            temperature: Some(0.0),
            ..SamplingParams::default()
        }),
        speculative: Some(SpeculativeParams {
            block_size: (block_size > 0).then_some(block_size),
            disabled: block_size == 0,
            ..Default::default()
        }),
        ..GenerateRequest::default()
    }
}

/// Every message of a stream: the token ids and the final message.
pub async fn drain_stream(
    mut stream: Streaming<GenerateStreamResponse>,
    mut tokens: Vec<u32>,
) -> (Vec<u32>, GenerateStreamResponse) {
    loop {
        let message = stream.message().await.unwrap().expect("stream ended early");
        tokens.extend_from_slice(&message.token_ids);
        if message.stats.is_some() {
            return (tokens, message);
        }
    }
}

/// `--draft drafters` for a router with drafter services (`drafters`, or a `--drafter-dns`
/// among `extra`) unless `extra` picks the drafting: these tests are about the services, and
/// the default puts prompt lookup in front of them.
fn services_alone(drafters: bool, extra: &[&str]) -> Option<[&'static str; 2]> {
    let has_services = drafters || extra.contains(&"--drafter-dns");
    (has_services && !extra.contains(&"--draft")).then_some(["--draft", "drafters"])
}
