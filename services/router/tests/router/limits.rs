//! The router's bounds on one request, through the real servers: each refusal names its
//! field and the flag that sets the limit, and nothing stays allocated.

use std::time::Duration;

use specd_core::NgramConfig;
use specd_router::{DraftSource, RequestLimits, RouterConfig};
use specd_wire::generation::{generate_request, GenerateRequest};
use tonic::Code;

use crate::support::*;

fn text_request(prompt: &str) -> GenerateRequest {
    GenerateRequest {
        input: Some(generate_request::Input::Prompt(prompt.into())),
        max_tokens: Some(4),
        ..GenerateRequest::default()
    }
}

#[tokio::test]
async fn oversized_requests_are_refused_naming_field_and_flag() {
    let (target, _) = word_level_target("limits");
    let verifier = start_verifier(8).await;
    let config = RouterConfig {
        requests: RequestLimits {
            max_prompt_bytes: 64,
            max_tokens: 100,
            max_stop_strings: 2,
            max_stop_string_bytes: 8,
            ..RequestLimits::default()
        },
        ..RouterConfig::default()
    };
    let router = start_router_with(&verifier, DraftSource::None, &target, config).await;
    let mut client = specd_wire::generation::GenerationClient::new(router.channel().await);
    client.generate(text_request("w1 w2 w3")).await.unwrap();
    let cases = [
        (
            text_request(&"w1 ".repeat(30)),
            "prompt:",
            "--max-prompt-bytes",
            Code::InvalidArgument,
        ),
        (
            GenerateRequest {
                max_tokens: Some(101),
                ..text_request("w1")
            },
            "max_tokens:",
            "--max-tokens-limit",
            Code::OutOfRange,
        ),
        (
            GenerateRequest {
                stop: vec!["a".into(), "b".into(), "c".into()],
                ..text_request("w1")
            },
            "stop:",
            "--max-stop-strings",
            Code::InvalidArgument,
        ),
        (
            GenerateRequest {
                stop: vec!["w1 w2 w3 w4".into()],
                ..text_request("w1")
            },
            "stop[0]:",
            "--max-stop-string-bytes",
            Code::InvalidArgument,
        ),
    ];
    for (request, field, flag, code) in cases {
        let err = client.generate(request).await.unwrap_err();
        assert_eq!(err.code(), code, "{err}");
        assert!(err.message().starts_with(field), "{err}");
        assert!(err.message().contains(flag), "{err}");
    }
}

#[tokio::test]
async fn a_request_past_the_duration_limit_ends_and_frees_its_sequence() {
    let verifier = start_verifier(8).await;
    let config = RouterConfig {
        requests: RequestLimits {
            max_duration: Some(Duration::from_millis(20)),
            ..RequestLimits::default()
        },
        ..RouterConfig::default()
    };
    let router = start_router_with(
        &verifier,
        DraftSource::Ngram(NgramConfig::default()),
        &fixture("target-full"),
        config,
    )
    .await;
    let mut client = specd_wire::generation::GenerationClient::new(router.channel().await);
    let err = client
        .generate(ids_request(&PROMPT, 900))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    assert!(err.message().contains("--max-request-secs"), "{err}");
    let stack = Stack {
        verifier,
        drafter: None,
        router,
    };
    assert!(stack.drained().await, "the sequence outlived its request");
}

#[tokio::test]
async fn a_snapshot_over_the_routers_limit_is_refused_and_released() {
    let verifier = start_verifier(8).await;
    let drafter = start_drafter_for(DrafterSetup::Mtp).await.unwrap();
    let config = RouterConfig {
        max_snapshot_bytes: 256,
        ..RouterConfig::default()
    };
    let router = start_router_with(
        &verifier,
        DraftSource::Remote(vec![drafter.url()]),
        &fixture("target-full"),
        config,
    )
    .await;
    let mut client = specd_wire::generation::GenerationClient::new(router.channel().await);
    let err = client.generate(ids_request(&PROMPT, 8)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("--max-snapshot-bytes"), "{err}");
    let stack = Stack {
        verifier,
        drafter: Some(drafter),
        router,
    };
    assert!(stack.drained().await, "the sequence outlived its request");
}
