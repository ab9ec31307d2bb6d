//! SIGTERM drains `specd serve router`: health turns NOT_SERVING, new requests are refused
//! with UNAVAILABLE, the running stream completes, then the process exits 0.

use crate::served::{drain_stream, request, Service};
use specd_wire::generation::{FinishReason, GenerationClient};
use tonic::transport::Channel;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const PROMPT: [u32; 5] = [2, 17, 201, 5, 9];
const MAX_TOKENS: u32 = 900;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_running_streams_and_refuses_new_requests() {
    let verifier = Service::verifier();
    let mut router = Service::router(&verifier, &[], &[]);
    let channel = router.channel().await;
    let mut client = GenerationClient::new(channel.clone());
    let mut health = HealthClient::new(channel);

    let mut stream = client
        .generate_stream(request(&PROMPT, MAX_TOKENS, 0))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap().token_ids;
    router.terminate();

    // The signal arrives asynchronously; health is the first thing to change.
    let mut status = ServingStatus::Serving;
    for _ in 0..1000 {
        status = health
            .check(HealthCheckRequest {
                service: "specd.v1.Generation".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status();
        if status != ServingStatus::Serving {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(status, ServingStatus::NotServing);

    let refused = client.generate(request(&PROMPT, 4, 0)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused}");

    let (tokens, last) = drain_stream(stream, first).await;
    assert_eq!(tokens.len(), MAX_TOKENS as usize);
    assert_eq!(last.finish_reason(), FinishReason::Length);

    let exit = router.wait();
    assert!(exit.success(), "router exited with {exit}");
    assert_eq!(verifier.live_sequences().await, 0);
}

/// The health of `service`'s `name`; one that no longer accepts connections or calls has
/// already drained and exited (its exit status is checked at the end).
async fn serving_status(service: &Service, name: &str) -> ServingStatus {
    let Ok(channel) = Channel::from_shared(service.url.clone())
        .unwrap()
        .connect()
        .await
    else {
        return ServingStatus::NotServing;
    };
    let checked = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: name.into(),
        })
        .await;
    match checked {
        Ok(response) => response.into_inner().status(),
        Err(status) if status.code() == Code::Unavailable => ServingStatus::NotServing,
        Err(status) => panic!("health of {name}: {status}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_verifier_and_drafter_after_their_last_request() {
    let mut verifier = Service::verifier();
    let mut drafter = Service::mtp_drafter();
    let router = Service::router(&verifier, &[&drafter], &[]);
    let mut client = GenerationClient::new(router.channel().await);
    let want = client
        .generate(request(&PROMPT, MAX_TOKENS, 0))
        .await
        .unwrap()
        .into_inner()
        .token_ids;

    let mut stream = client
        .generate_stream(request(&PROMPT, MAX_TOKENS, 4))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap().token_ids;
    verifier.terminate();
    drafter.terminate();

    for (service, name) in [
        (&verifier, "specd.v1.Verifier"),
        (&drafter, "specd.v1.Drafter"),
    ] {
        let mut status = ServingStatus::Serving;
        for _ in 0..1000 {
            // The running request can finish, and the service drain and exit, before the
            // first look on a loaded machine.
            status = serving_status(service, name).await;
            if status != ServingStatus::Serving {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(status, ServingStatus::NotServing, "{name}");
    }

    // A new request needs a new verifier sequence, which the draining verifier refuses.
    let refused = client.generate(request(&PROMPT, 4, 0)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused}");

    // The running request keeps its sequence and session to the end.
    let (tokens, last) = drain_stream(stream, first).await;
    assert_eq!(tokens, want);
    assert!(last.stats.unwrap().drafted > 0);

    let exit = verifier.wait();
    assert!(exit.success(), "verifier exited with {exit}");
    let exit = drafter.wait();
    assert!(exit.success(), "drafter exited with {exit}");
}
