//! Health, reflection and message limits on real tonic servers bound to 127.0.0.1, queried
//! with the real tonic-health and tonic-reflection clients.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::pin::Pin;

use candle_core::{DType, Device, Tensor};
use prost::Message;
use prost_types::FileDescriptorProto;
use specd_wire::descriptor::{reflection_service, SpecdService, FILE_DESCRIPTOR_SET};
use specd_wire::health::HealthState;
use specd_wire::kv::{snapshot_chunks, KvPair, KvSnapshot, SnapshotAssembler};
use specd_wire::limits::{MessageLimits, WithMessageLimits};
use specd_wire::verifier::{
    PrefillRequest, PrefillResponse, ReleaseRequest, ReleaseResponse, SnapshotRequest,
    TruncateRequest, TruncateResponse, Verifier, VerifierClient, VerifierServer,
    VerifierStatsRequest, VerifierStatsResponse, VerifyRequest, VerifyResponse,
};
use specd_wire::SnapshotChunk;
use tokio::sync::oneshot;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;

/// A running server; dropping it shuts the server down.
struct TestServer {
    addr: SocketAddr,
    _shutdown: oneshot::Sender<()>,
}

impl TestServer {
    async fn start(router: tonic::transport::server::Router) -> Self {
        let incoming = TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = incoming.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        Self {
            addr,
            _shutdown: tx,
        }
    }

    async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }
}

async fn check(client: &mut HealthClient<Channel>, service: &str) -> Result<ServingStatus, Status> {
    let reply = client
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await?;
    Ok(reply.into_inner().status())
}

#[tokio::test]
async fn health_is_not_serving_until_the_server_says_so() {
    let (health, health_service) = HealthState::starting(&[SpecdService::Verifier]).await;
    let server = TestServer::start(Server::builder().add_service(health_service)).await;
    let mut client = HealthClient::new(server.channel().await);

    assert_eq!(
        check(&mut client, "").await.unwrap(),
        ServingStatus::NotServing
    );
    assert_eq!(
        check(&mut client, "specd.v1.Verifier").await.unwrap(),
        ServingStatus::NotServing
    );

    health.set_serving().await;
    assert_eq!(
        check(&mut client, "").await.unwrap(),
        ServingStatus::Serving
    );
    assert_eq!(
        check(&mut client, "specd.v1.Verifier").await.unwrap(),
        ServingStatus::Serving
    );
    // A service this server does not host is unknown to it.
    let err = check(&mut client, "specd.v1.Drafter").await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    health.set_not_serving().await;
    assert_eq!(
        check(&mut client, "specd.v1.Verifier").await.unwrap(),
        ServingStatus::NotServing
    );
}

/// Sends one reflection request and returns its answer.
async fn reflect(
    client: &mut ServerReflectionClient<Channel>,
    request: MessageRequest,
) -> MessageResponse {
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut replies = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    replies
        .next()
        .await
        .expect("one reply")
        .unwrap()
        .message_response
        .expect("a message response")
}

async fn listed_services(client: &mut ServerReflectionClient<Channel>) -> BTreeSet<String> {
    match reflect(client, MessageRequest::ListServices(String::new())).await {
        MessageResponse::ListServicesResponse(list) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection answer {other:?}"),
    }
}

async fn files_containing(
    client: &mut ServerReflectionClient<Channel>,
    symbol: &str,
) -> Vec<FileDescriptorProto> {
    match reflect(
        client,
        MessageRequest::FileContainingSymbol(symbol.to_owned()),
    )
    .await
    {
        MessageResponse::FileDescriptorResponse(files) => files
            .file_descriptor_proto
            .iter()
            .map(|raw| FileDescriptorProto::decode(raw.as_slice()).unwrap())
            .collect(),
        other => panic!("unexpected reflection answer for {symbol}: {other:?}"),
    }
}

#[tokio::test]
async fn reflection_lists_and_describes_every_specd_service() {
    let (health, health_service) = HealthState::starting(&SpecdService::ALL).await;
    health.set_serving().await;
    let server = TestServer::start(
        Server::builder()
            .add_service(health_service)
            .add_service(reflection_service(&SpecdService::ALL).unwrap()),
    )
    .await;
    let mut client = ServerReflectionClient::new(server.channel().await);

    let services = listed_services(&mut client).await;
    let expected: BTreeSet<String> = [
        "specd.v1.Generation",
        "specd.v1.Verifier",
        "specd.v1.Drafter",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(services, expected);

    // The verifier's file comes with its imports and its documentation.
    let files = files_containing(&mut client, "specd.v1.Verifier").await;
    let verifier = files
        .iter()
        .find(|f| f.name() == "specd/v1/verifier.proto")
        .expect("verifier.proto");
    let service = &verifier.service[0];
    assert_eq!(service.name(), "Verifier");
    let methods: Vec<&str> = service.method.iter().map(|m| m.name()).collect();
    assert_eq!(
        methods,
        ["Prefill", "Verify", "Snapshot", "Truncate", "Release", "Stats"]
    );
    let comments: Vec<&str> = verifier
        .source_code_info
        .as_ref()
        .expect("source info")
        .location
        .iter()
        .filter_map(|l| l.leading_comments.as_deref())
        .collect();
    assert!(comments
        .iter()
        .any(|c| c.contains("Idempotent per (seq_id, round)")));

    let files = files_containing(&mut client, "specd.v1.Tensor").await;
    assert!(files.iter().any(|f| f.name() == "specd/v1/tensor.proto"));
    let files = files_containing(&mut client, "grpc.health.v1.Health").await;
    assert!(!files.is_empty());
}

#[tokio::test]
async fn reflection_lists_only_the_hosted_services() {
    let server = TestServer::start(
        Server::builder().add_service(reflection_service(&[SpecdService::Drafter]).unwrap()),
    )
    .await;
    let mut client = ServerReflectionClient::new(server.channel().await);
    let services = listed_services(&mut client).await;
    assert!(services.contains("specd.v1.Drafter"));
    assert!(!services.contains("specd.v1.Verifier"));
    assert!(!services.contains("specd.v1.Generation"));
}

#[test]
fn descriptor_set_holds_every_specd_file() {
    let set = prost_types::FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).unwrap();
    let names: BTreeSet<&str> = set.file.iter().map(|f| f.name()).collect();
    for file in [
        "tensor", "kv", "sampling", "generate", "verifier", "drafter",
    ] {
        assert!(
            names.contains(format!("specd/v1/{file}.proto").as_str()),
            "{file}"
        );
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Serves Verifier.Snapshot from a fixed K/V snapshot, to push real chunk streams and
/// oversized requests through a real transport. Sequence handling is the verifier service's
/// job, so every other method answers UNIMPLEMENTED.
struct SnapshotServer {
    snapshot: KvSnapshot,
    limits: MessageLimits,
}

#[tonic::async_trait]
impl Verifier for SnapshotServer {
    type PrefillStream = BoxStream<PrefillResponse>;
    type SnapshotStream = BoxStream<SnapshotChunk>;

    async fn prefill(
        &self,
        _: Request<PrefillRequest>,
    ) -> Result<Response<Self::PrefillStream>, Status> {
        Err(Status::unimplemented("prefill"))
    }

    async fn verify(&self, _: Request<VerifyRequest>) -> Result<Response<VerifyResponse>, Status> {
        Err(Status::unimplemented("verify"))
    }

    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        let chunk_bytes = self
            .limits
            .chunk_bytes_for(request.get_ref().max_chunk_bytes);
        let chunks = snapshot_chunks(&self.snapshot, chunk_bytes)?;
        Ok(Response::new(Box::pin(tokio_stream::iter(
            chunks.into_iter().map(Ok),
        ))))
    }

    async fn truncate(
        &self,
        _: Request<TruncateRequest>,
    ) -> Result<Response<TruncateResponse>, Status> {
        Err(Status::unimplemented("truncate"))
    }

    async fn release(
        &self,
        _: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        Err(Status::unimplemented("release"))
    }

    async fn stats(
        &self,
        _: Request<VerifierStatsRequest>,
    ) -> Result<Response<VerifierStatsResponse>, Status> {
        Err(Status::unimplemented("stats"))
    }
}

fn kv(heads: usize, rows: usize, offset: f32) -> Tensor {
    Tensor::arange(offset, offset + (heads * rows * 64) as f32, &Device::Cpu)
        .unwrap()
        .reshape((1, heads, rows, 64))
        .unwrap()
}

#[tokio::test]
async fn snapshot_larger_than_the_message_limit_streams_in_chunks() {
    let limits = MessageLimits::new(8 * 1024, 4 * 1024).unwrap();
    // full: 2 heads x 100 rows x 64 f32 = 51,200 bytes per tensor, six times the limit.
    let snapshot = KvSnapshot {
        committed_len: 100,
        sliding_start: 68,
        full: KvPair {
            k: kv(2, 100, 0.0),
            v: kv(2, 100, 1.0),
        },
        sliding: Some(KvPair {
            k: kv(1, 32, 2.0),
            v: kv(1, 32, 3.0),
        }),
    };
    let expected_full_v = snapshot
        .full
        .v
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let service =
        VerifierServer::new(SnapshotServer { snapshot, limits }).with_message_limits(&limits);
    let server = TestServer::start(Server::builder().add_service(service)).await;
    let mut client = VerifierClient::new(server.channel().await).with_message_limits(&limits);

    // Asking for a larger chunk than the server allows still gets chunks within its limit.
    let mut stream = client
        .snapshot(SnapshotRequest {
            seq_id: "1".into(),
            max_chunk_bytes: 1 << 20,
        })
        .await
        .unwrap()
        .into_inner();
    let mut assembler = SnapshotAssembler::new("snapshot", 1 << 20);
    let mut chunks = 0;
    while let Some(chunk) = stream.next().await {
        assembler.push(chunk.unwrap()).unwrap();
        chunks += 1;
    }
    assert!(assembler.is_complete());
    let back = assembler.finish(&Device::Cpu).unwrap();
    assert_eq!(back.full.v.dtype(), DType::F32);
    assert_eq!(
        back.full.v.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        expected_full_v
    );
    // 1 header + 13 chunks per full tensor + 2 per sliding tensor.
    assert_eq!(chunks, 1 + 2 * 13 + 2 * 2);
}

#[tokio::test]
async fn oversized_messages_are_refused_on_both_ends() {
    let tight = MessageLimits::new(8 * 1024, 4 * 1024).unwrap();
    let loose = MessageLimits::new(1024 * 1024, 16 * 1024).unwrap();
    let big_snapshot = || KvSnapshot {
        committed_len: 100,
        sliding_start: 0,
        full: KvPair {
            k: kv(2, 100, 0.0),
            v: kv(2, 100, 1.0),
        },
        sliding: None,
    };
    let start = |limits: MessageLimits| async move {
        let service = VerifierServer::new(SnapshotServer {
            snapshot: big_snapshot(),
            limits,
        })
        .with_message_limits(&limits);
        TestServer::start(Server::builder().add_service(service)).await
    };
    let tight_server = start(tight).await;
    let loose_server = start(loose).await;
    let oversized = || VerifyRequest {
        seq_id: "1".into(),
        round: 1,
        tokens: vec![262_143; 4096], // 3 bytes each on the wire: 12 KiB
        budget: 1,
        output_index_base: 1,
        committed_len: 1,
        masks: Vec::new(),
        parents: Vec::new(),
    };

    // Unlimited clients: a small request reaches the handler, an oversized one is refused by
    // the tight server's decoding limit and reaches the loose server's handler.
    let mut to_tight = VerifierClient::new(tight_server.channel().await);
    let small = VerifyRequest {
        tokens: vec![1, 2, 3],
        ..oversized()
    };
    let err = to_tight.verify(small).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    let err = to_tight.verify(oversized()).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err}");
    assert!(
        err.message().contains("decoded message length too large"),
        "{err}"
    );
    let mut to_loose = VerifierClient::new(loose_server.channel().await);
    let err = to_loose.verify(oversized()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);

    // A tightly limited client does not send it even to the loose server.
    let mut tight_client =
        VerifierClient::new(loose_server.channel().await).with_message_limits(&tight);
    let err = tight_client.verify(oversized()).await.unwrap_err();
    assert_ne!(err.code(), Code::Unimplemented, "{err}");

    // Nor does it accept the loose server's 16 KiB snapshot chunks.
    let mut stream = tight_client
        .snapshot(SnapshotRequest {
            seq_id: "1".into(),
            max_chunk_bytes: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let header = stream.next().await.unwrap();
    assert!(header.is_ok());
    let err = stream.next().await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err}");
}

#[tokio::test]
async fn reflection_can_be_switched_off_while_health_stays() {
    use specd_wire::serving::{serve_draining, Drain, ServeOptions};
    let incoming = TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = incoming.local_addr().unwrap();
    let snapshot = KvSnapshot {
        committed_len: 1,
        sliding_start: 0,
        full: KvPair {
            k: kv(1, 1, 0.0),
            v: kv(1, 1, 1.0),
        },
        sliding: None,
    };
    let service = VerifierServer::new(SnapshotServer {
        snapshot,
        limits: MessageLimits::default(),
    });
    let options = ServeOptions {
        reflection: false,
        ..ServeOptions::default()
    };
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        serve_draining(
            SpecdService::Verifier,
            &options,
            service,
            incoming,
            |_| tracing::Span::none(),
            async {
                let _ = stopped.await;
            },
            Drain {
                begin: || {},
                finished: async {},
                what: "nothing to finish",
            },
            None,
        )
        .await
        .unwrap();
    });
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let health = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status(), ServingStatus::Serving);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let answer = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter([request]))
        .await;
    let code = match answer {
        Err(status) => status.code(),
        Ok(mut stream) => stream.get_mut().message().await.unwrap_err().code(),
    };
    assert_eq!(code, Code::Unimplemented);
    drop(stop);
}
