//! Tracing and metrics end to end: a router, an MTP drafter and a verifier, each exporting
//! spans over OTLP to a receiver inside this test and serving Prometheus metrics. One request
//! must be one trace with the generate → round → draft/verify client → server tree, and the
//! metrics must add up to the statistics the client received.

use crate::common::fixture;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use specd_wire::generation::{
    generate_request, GenerateRequest, GenerateResponse, GenerationClient, SamplingParams,
    SpeculativeParams, TokenIds,
};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

/// A span as received, with the service that sent it.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    span: Span,
}

/// The OTLP trace receiver: keeps every exported span.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| string_value(kv.value.as_ref()?.value.as_ref()?))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    spans.push(Received {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

fn string_value(value: &AnyValue) -> Option<String> {
    match value {
        AnyValue::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn int_attribute(span: &Span, key: &str) -> Option<i64> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            AnyValue::IntValue(v) => Some(*v),
            _ => None,
        })
}

/// A service process with its gRPC and metrics addresses, killed when dropped.
struct Service {
    child: Child,
    url: String,
    metrics: String,
}

impl Service {
    fn start(args: &[&str], otlp: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_specd"))
            .arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
            .args(["--otlp-endpoint", otlp])
            // Export batches every 100 ms so the test does not wait for the default 5 s.
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env_remove("OTEL_SERVICE_NAME")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let metrics = line
            .trim()
            .strip_prefix("metrics listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?} from {args:?}"))
            .to_owned();
        line.clear();
        stdout.read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected second line {line:?} from {args:?}"))
            .to_owned();
        Self {
            child,
            url: format!("http://{addr}"),
            metrics,
        }
    }

    /// The Prometheus text of this service.
    fn scrape(&self) -> String {
        scrape(&self.metrics)
    }
}

/// The Prometheus text of the metrics endpoint at `metrics`.
pub(crate) fn scrape(metrics: &str) -> String {
    let mut stream = TcpStream::connect(metrics).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        metrics
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain"),
        "{head}"
    );
    body.to_owned()
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sum of the samples of `name` whose labels include every `labels` pair.
pub(crate) fn sample_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, label_text) = match series.split_once('{') {
                Some((metric, rest)) => (metric, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let wanted = labels
                .iter()
                .all(|(k, v)| label_text.split(',').any(|l| l == format!("{k}=\"{v}\"")));
            (metric == name && wanted).then(|| value.parse::<f64>().unwrap())
        })
        .sum()
}

fn request(block_size: u32) -> GenerateRequest {
    GenerateRequest {
        input: Some(generate_request::Input::PromptIds(TokenIds {
            ids: vec![2, 17, 201, 5, 9],
        })),
        max_tokens: Some(12),
        ignore_eos: true,
        sampling: Some(SamplingParams {
            temperature: Some(0.0),
            ..SamplingParams::default()
        }),
        speculative: Some(SpeculativeParams {
            block_size: Some(block_size),
            disabled: false,
            ..Default::default()
        }),
        ..GenerateRequest::default()
    }
}

/// The spans of one request's trace, indexed for the structural checks.
struct Trace<'a> {
    spans: Vec<&'a Received>,
    by_id: HashMap<&'a [u8], &'a Received>,
}

impl<'a> Trace<'a> {
    fn new(spans: Vec<&'a Received>) -> Self {
        let by_id = spans.iter().map(|r| (&r.span.span_id[..], *r)).collect();
        Self { spans, by_id }
    }

    fn named(&self, name: &str, kind: SpanKind, service: &str) -> Vec<&'a Received> {
        self.spans
            .iter()
            .copied()
            .filter(|r| r.span.name == name && r.span.kind() == kind && r.service == service)
            .collect()
    }

    fn parent(&self, span: &Received) -> Option<&'a Received> {
        self.by_id.get(&span.span.parent_span_id[..]).copied()
    }

    fn children(&self, parent: &Received, name: &str, kind: SpanKind) -> Vec<&'a Received> {
        self.spans
            .iter()
            .copied()
            .filter(|r| {
                r.span.parent_span_id == parent.span.span_id
                    && r.span.name == name
                    && r.span.kind() == kind
            })
            .collect()
    }
}

/// The traces holding a round-loop `generate` span, once each is complete: every verify and
/// draft client span has its server span.
fn complete_traces(spans: &[Received], requests: usize) -> Option<Vec<Vec<&Received>>> {
    let mut traces: HashMap<&[u8], Vec<&Received>> = HashMap::new();
    for received in spans {
        traces
            .entry(&received.span.trace_id)
            .or_default()
            .push(received);
    }
    let generation: Vec<Vec<&Received>> = traces
        .into_values()
        .filter(|t| {
            t.iter()
                .any(|r| r.span.name == "generate" && r.span.kind() == SpanKind::Internal)
        })
        .collect();
    if generation.len() < requests {
        return None;
    }
    let done = generation.iter().all(|spans| {
        let trace = Trace::new(spans.clone());
        let mut clients = trace.named("verify", SpanKind::Client, "specd-router");
        clients.extend(trace.named("draft", SpanKind::Client, "specd-router"));
        let all_served = clients.iter().all(|client| {
            !trace
                .children(client, &client.span.name, SpanKind::Server)
                .is_empty()
        });
        let root_done = spans
            .iter()
            .any(|r| r.span.name == "generate" && r.span.kind() == SpanKind::Server);
        !clients.is_empty() && all_served && root_done
    });
    done.then_some(generation)
}

/// Whether every Verify call the verifier served is linked from the `verify_batch` span of
/// the batched forward that ran its row (each forward is a trace of its own).
fn batches_link_every_row(spans: &[Received]) -> bool {
    let linked: HashSet<(&[u8], &[u8])> = spans
        .iter()
        .filter(|r| r.span.name == "verify_batch" && r.service == "specd-verifier")
        .flat_map(|r| r.span.links.iter())
        .map(|link| (&link.trace_id[..], &link.span_id[..]))
        .collect();
    spans
        .iter()
        .filter(|r| {
            r.span.name == "verify"
                && r.span.kind() == SpanKind::Server
                && r.service == "specd-verifier"
        })
        .all(|r| linked.contains(&(&r.span.trace_id[..], &r.span.span_id[..])))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_is_one_trace_and_metrics_match_the_stats() {
    let receiver = Receiver::default();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );

    let target = fixture("target-full").to_string_lossy().into_owned();
    let assistant = fixture("assistant-dense").to_string_lossy().into_owned();
    let verifier = Service::start(&["verifier", "--target", &target], &otlp);
    let drafter = Service::start(
        &["drafter", "--drafter", &assistant, "--target", &target],
        &otlp,
    );
    let router = Service::start(
        &[
            "router",
            "--verifier",
            &verifier.url,
            "--drafters",
            &drafter.url,
            "--draft",
            "drafters",
            "--target",
            &target,
        ],
        &otlp,
    );

    let mut client = GenerationClient::connect(router.url.clone()).await.unwrap();
    let mut responses: Vec<GenerateResponse> = Vec::new();
    for block_size in [3, 4] {
        responses.push(
            client
                .generate(request(block_size))
                .await
                .unwrap()
                .into_inner(),
        );
    }
    let stats: Vec<_> = responses.iter().map(|r| r.stats.clone().unwrap()).collect();
    assert!(stats.iter().all(|s| s.drafted > 0), "{stats:?}");

    // Spans arrive in export batches; wait for both requests' traces to be complete.
    let waited = Instant::now();
    let spans = loop {
        let spans = receiver.spans.lock().unwrap().clone();
        if complete_traces(&spans, responses.len()).is_some() && batches_link_every_row(&spans) {
            break spans;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "traces incomplete; received {} spans: {:?}",
            spans.len(),
            spans
                .iter()
                .map(|r| (&r.service, &r.span.name))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let traces = complete_traces(&spans, responses.len()).unwrap();
    assert_eq!(traces.len(), responses.len(), "one trace per request");

    let mut trace_rounds: Vec<u32> = Vec::new();
    let mut draft_calls = 0;
    for spans in traces {
        let trace = Trace::new(spans);
        // One root: the router's server span of the Generate call; every other span's
        // parent is in the same trace.
        let roots: Vec<_> = trace
            .spans
            .iter()
            .filter(|r| r.span.parent_span_id.is_empty())
            .collect();
        assert_eq!(roots.len(), 1, "{:?}", roots);
        assert_eq!(roots[0].span.name, "generate");
        assert_eq!(roots[0].span.kind(), SpanKind::Server);
        assert_eq!(roots[0].service, "specd-router");
        for received in &trace.spans {
            if !received.span.parent_span_id.is_empty() {
                assert!(
                    trace.parent(received).is_some(),
                    "{} span {} has no parent in its trace",
                    received.service,
                    received.span.name
                );
            }
        }
        let services: HashSet<&str> = trace.spans.iter().map(|r| r.service.as_str()).collect();
        assert_eq!(
            services,
            HashSet::from(["specd-router", "specd-verifier", "specd-drafter"])
        );

        let generate = trace.named("generate", SpanKind::Internal, "specd-router");
        assert_eq!(generate.len(), 1);
        let generate = generate[0];
        assert_eq!(
            trace.parent(generate).unwrap().span.span_id,
            roots[0].span.span_id
        );
        let rounds = trace.children(generate, "round", SpanKind::Internal);
        trace_rounds.push(rounds.len() as u32);
        let (mut drafted, mut accepted) = (0, 0);
        for round in &rounds {
            for key in ["round", "block_size", "drafted", "accepted", "emitted"] {
                assert!(
                    int_attribute(&round.span, key).is_some(),
                    "round lacks {key}: {:?}",
                    round.span.attributes
                );
            }
            drafted += int_attribute(&round.span, "drafted").unwrap();
            accepted += int_attribute(&round.span, "accepted").unwrap();

            let verifies = trace.children(round, "verify", SpanKind::Client);
            assert_eq!(verifies.len(), 1, "one verify call per round");
            let served = trace.children(verifies[0], "verify", SpanKind::Server);
            assert_eq!(served.len(), 1);
            assert_eq!(served[0].service, "specd-verifier");
            for key in ["round", "block_size", "accepted", "bytes"] {
                assert!(
                    int_attribute(&verifies[0].span, key).is_some(),
                    "verify lacks {key}"
                );
            }
            for key in ["block_size", "accepted", "rows"] {
                assert!(
                    int_attribute(&served[0].span, key).is_some(),
                    "server lacks {key}"
                );
            }
            assert_eq!(
                int_attribute(&served[0].span, "accepted"),
                int_attribute(&round.span, "accepted")
            );

            let drafts = trace.children(round, "draft", SpanKind::Client);
            assert!(drafts.len() <= 1);
            for draft in drafts {
                draft_calls += 1;
                let served = trace.children(draft, "draft", SpanKind::Server);
                assert_eq!(served.len(), 1);
                assert_eq!(served[0].service, "specd-drafter");
                assert_eq!(
                    int_attribute(&served[0].span, "drafted"),
                    int_attribute(&draft.span, "drafted")
                );
            }
        }
        // The trace's rounds are the rounds some response reports.
        let matching = stats.iter().find(|s| {
            s.rounds as usize == rounds.len()
                && i64::from(s.drafted) == drafted
                && i64::from(s.accepted) == accepted
        });
        assert!(
            matching.is_some(),
            "no response has {} rounds",
            rounds.len()
        );
    }
    assert!(draft_calls > 0, "no Draft call was traced");
    trace_rounds.sort_unstable();
    let mut reported: Vec<u32> = stats.iter().map(|s| s.rounds).collect();
    reported.sort_unstable();
    assert_eq!(trace_rounds, reported);

    // The counters reconcile with what the client was told.
    let total = |f: fn(&specd_wire::generation::GenerationStats) -> u32| -> f64 {
        stats.iter().map(|s| f64::from(f(s))).sum()
    };
    let routed = router.scrape();
    assert_eq!(
        sample_sum(&routed, "specd_rounds_total", &[]),
        total(|s| s.rounds)
    );
    assert_eq!(
        sample_sum(&routed, "specd_rounds_total", &[("drafter_kind", "mtp")])
            + sample_sum(&routed, "specd_rounds_total", &[("drafter_kind", "none")]),
        total(|s| s.rounds)
    );
    assert_eq!(
        sample_sum(&routed, "specd_drafted_tokens_total", &[]),
        total(|s| s.drafted)
    );
    assert_eq!(
        sample_sum(&routed, "specd_accepted_tokens_total", &[]),
        total(|s| s.accepted)
    );
    let emitted: usize = responses.iter().map(|r| r.token_ids.len()).sum();
    assert_eq!(
        sample_sum(&routed, "specd_emitted_tokens_total", &[]),
        emitted as f64
    );
    assert_eq!(
        sample_sum(
            &routed,
            "specd_requests_total",
            &[("finish_reason", "length")]
        ),
        responses.len() as f64
    );
    for position in 1..=3usize {
        let label = position.to_string();
        let want: f64 = stats
            .iter()
            .map(|s| {
                f64::from(
                    s.accepted_per_position
                        .get(position - 1)
                        .copied()
                        .unwrap_or(0),
                )
            })
            .sum();
        assert_eq!(
            sample_sum(
                &routed,
                "specd_accepted_tokens_total",
                &[("position", &label)]
            ),
            want,
            "position {position}"
        );
    }
    let rounds = total(|s| s.rounds);
    for (name, labels) in [
        ("specd_round_duration_seconds_count", vec![]),
        ("specd_block_size_count", vec![]),
        (
            "specd_verify_duration_seconds_count",
            vec![("side", "client")],
        ),
    ] {
        assert_eq!(sample_sum(&routed, name, &labels), rounds, "{name}");
    }
    assert_eq!(
        sample_sum(&routed, "specd_time_to_first_token_seconds_count", &[]),
        responses.len() as f64
    );
    assert_eq!(
        sample_sum(
            &routed,
            "specd_draft_duration_seconds_count",
            &[("side", "client")]
        ),
        f64::from(draft_calls)
    );
    assert!(
        sample_sum(
            &routed,
            "specd_wire_bytes_total",
            &[("rpc", "verify"), ("direction", "sent")]
        ) > 0.0
    );
    assert!(
        routed.contains("specd_round_duration_seconds_bucket{le=\""),
        "{routed}"
    );
    assert!(routed.contains("specd_active_requests"), "{routed}");
    assert_eq!(sample_sum(&routed, "specd_active_requests", &[]), 0.0);
    // Fixed block sizes, one request at a time: the governor never capped.
    assert!(routed.contains("specd_speculation_cap"), "{routed}");
    assert_eq!(sample_sum(&routed, "specd_speculation_cap", &[]), 0.0);

    let verified = verifier.scrape();
    assert_eq!(
        sample_sum(
            &verified,
            "specd_verify_duration_seconds_count",
            &[("side", "server")]
        ),
        rounds
    );
    assert_eq!(
        sample_sum(
            &verified,
            "specd_wire_bytes_total",
            &[("rpc", "verify"), ("direction", "sent")]
        ),
        sample_sum(
            &routed,
            "specd_wire_bytes_total",
            &[("rpc", "verify"), ("direction", "received")]
        )
    );
    let drafted = drafter.scrape();
    assert_eq!(
        sample_sum(
            &drafted,
            "specd_draft_duration_seconds_count",
            &[("side", "server")]
        ),
        f64::from(draft_calls)
    );
    assert!(drafted.contains("specd_drafter_sessions"), "{drafted}");
}
