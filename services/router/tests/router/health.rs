//! Each service reports SERVING and lists itself by reflection.

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;

use crate::support::*;

async fn listed_services(server: &Running) -> Vec<String> {
    let mut client = ServerReflectionClient::new(server.channel().await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    match replies.message().await.unwrap().unwrap().message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection answer {other:?}"),
    }
}

#[tokio::test]
async fn all_three_services_report_serving_and_reflect() {
    let stack = Stack::start(Some(DrafterSetup::RandomMtp)).await;
    let servers = [
        (&stack.router, "specd.v1.Generation"),
        (&stack.verifier, "specd.v1.Verifier"),
        (stack.drafter.as_ref().unwrap(), "specd.v1.Drafter"),
    ];
    for (server, service) in servers {
        let mut health = HealthClient::new(server.channel().await);
        for name in ["", service] {
            let status = health
                .check(HealthCheckRequest {
                    service: name.into(),
                })
                .await
                .unwrap()
                .into_inner()
                .status();
            assert_eq!(status, ServingStatus::Serving, "{service} {name:?}");
        }
        let listed = listed_services(server).await;
        assert!(listed.iter().any(|s| s == service), "{service}: {listed:?}");
        assert!(listed.iter().any(|s| s == "grpc.health.v1.Health"));
    }
}
