//! Close, expiry, health, and opens abandoned by their clients.

use std::time::Duration;

use specd_drafter::DrafterServerConfig;
use specd_wire::drafter::{CloseRequest, DrafterKind, OpenHeader};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::support::*;

#[tokio::test]
async fn close_is_idempotent_and_frees_the_session() {
    let server = TestDrafter::start(DrafterKind::Mtp).await;
    let mut client = server.client().await;
    let session = open_mtp(&mut client, 8).await.unwrap();
    assert_eq!(live_sessions(&mut client).await, 1);
    let close = |client: &mut specd_wire::drafter::DrafterClient<_>| {
        let mut client = client.clone();
        let session_id = session.clone();
        async move {
            client
                .close(CloseRequest { session_id })
                .await
                .unwrap()
                .into_inner()
                .closed
        }
    };
    assert!(close(&mut client).await);
    assert!(!close(&mut client).await);
    let err = draft(&mut client, mtp_draft(&session, 1, 7, 1, None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    assert_eq!(live_sessions(&mut client).await, 0);
}

#[tokio::test]
async fn an_open_stream_cut_short_leaves_no_session() {
    let server = TestDrafter::start(DrafterKind::Mtp).await;
    let mut admin = server.client().await;
    for _ in 0..4 {
        let mut client = server.client().await;
        let header = OpenHeader {
            sampling: sampling(),
            committed_len: 10,
            context_ids: Vec::new(),
            cache_scope: String::new(),
        };
        let messages = open_messages(header, Some(&snapshot(10, 5)));
        // The client sends the header and a few chunks, then gives up.
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        for message in messages.into_iter().take(3) {
            sender.send(message).await.unwrap();
        }
        let call = client.open(tokio_stream::wrappers::ReceiverStream::new(receiver));
        let _ = tokio::time::timeout(Duration::from_millis(20), call).await;
        drop(sender);
    }
    assert!(drained(&mut admin).await);
}

#[tokio::test]
async fn idle_sessions_expire() {
    let config = DrafterServerConfig {
        idle_timeout: Some(Duration::from_millis(100)),
        ..DrafterServerConfig::default()
    };
    let server = TestDrafter::start_with(DrafterKind::Mtp, config).await;
    let mut client = server.client().await;
    open_mtp(&mut client, 8).await.unwrap();
    assert!(
        drained(&mut client).await,
        "the idle session did not expire"
    );
}

#[tokio::test]
async fn health_reports_serving() {
    let server = TestDrafter::start(DrafterKind::Mtp).await;
    let mut health = HealthClient::new(server.channel().await);
    for service in ["", "specd.v1.Drafter"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status();
        assert_eq!(status, ServingStatus::Serving, "{service:?}");
    }
}
