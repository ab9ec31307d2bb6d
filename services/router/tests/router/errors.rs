//! Bad requests get the right status code, naming the field, on both RPCs.

use specd_router::{DraftSource, GenerationService, RouterConfig, TargetText, VerifierSource};
use specd_wire::generation::{generate_request, GenerateRequest, SamplingParams, TokenIds};
use tonic::Code;

use crate::support::*;

fn cases() -> Vec<(&'static str, GenerateRequest, Code, &'static str)> {
    let ids = |ids: Vec<u32>| GenerateRequest {
        input: Some(generate_request::Input::PromptIds(TokenIds { ids })),
        max_tokens: Some(8),
        ..GenerateRequest::default()
    };
    let sampling = |temperature: Option<f32>, top_p: Option<f32>| GenerateRequest {
        sampling: Some(SamplingParams {
            temperature,
            top_p,
            top_k: None,
            seed: None,
            ..Default::default()
        }),
        ..ids(PROMPT.to_vec())
    };
    vec![
        (
            "no input",
            GenerateRequest::default(),
            Code::InvalidArgument,
            "input",
        ),
        (
            "empty ids",
            ids(Vec::new()),
            Code::InvalidArgument,
            "prompt_ids",
        ),
        (
            "id over vocab",
            ids(vec![2, 256]),
            Code::InvalidArgument,
            "prompt_ids[1]",
        ),
        (
            "prompt over context",
            ids(vec![3; 1024]),
            Code::OutOfRange,
            "prompt_ids",
        ),
        (
            "zero max_tokens",
            GenerateRequest {
                max_tokens: Some(0),
                ..ids(PROMPT.to_vec())
            },
            Code::InvalidArgument,
            "max_tokens",
        ),
        (
            "absurd max_tokens",
            GenerateRequest {
                max_tokens: Some(u32::MAX),
                ..ids(PROMPT.to_vec())
            },
            Code::OutOfRange,
            "max_tokens",
        ),
        (
            "max_tokens past the context",
            GenerateRequest {
                max_tokens: Some(1024 - PROMPT.len() as u32 + 1),
                ..ids(PROMPT.to_vec())
            },
            Code::OutOfRange,
            "max_tokens",
        ),
        (
            "NaN temperature",
            sampling(Some(f32::NAN), None),
            Code::InvalidArgument,
            "sampling.temperature",
        ),
        (
            "negative temperature",
            sampling(Some(-1.0), None),
            Code::InvalidArgument,
            "sampling.temperature",
        ),
        (
            "zero top_p",
            sampling(None, Some(0.0)),
            Code::InvalidArgument,
            "sampling.top_p",
        ),
        (
            "zero block size",
            with_block(ids(PROMPT.to_vec()), Some(0), false),
            Code::InvalidArgument,
            "speculative.block_size",
        ),
        (
            "empty stop string",
            GenerateRequest {
                stop: vec!["a".into(), String::new()],
                ..ids(PROMPT.to_vec())
            },
            Code::InvalidArgument,
            "stop[1]",
        ),
        (
            "stop strings without a tokenizer",
            GenerateRequest {
                stop: vec!["a".into()],
                ..ids(PROMPT.to_vec())
            },
            Code::InvalidArgument,
            "stop",
        ),
        (
            "text without a tokenizer",
            GenerateRequest {
                input: Some(generate_request::Input::Prompt("hello".into())),
                ..GenerateRequest::default()
            },
            Code::InvalidArgument,
            "prompt",
        ),
    ]
}

#[tokio::test]
async fn bad_requests_are_refused_naming_the_field() {
    let stack = Stack::start(Some(DrafterSetup::RandomMtp)).await;
    let mut client = stack.client().await;
    for (what, request, code, field) in cases() {
        let err = generate(&mut client, request.clone()).await.unwrap_err();
        assert_eq!(err.code(), code, "{what}: {err}");
        assert!(
            err.message().contains(field),
            "{what}: {field} not named in {err}"
        );
        let err = client.generate_stream(request).await.unwrap_err();
        assert_eq!(err.code(), code, "{what} (stream): {err}");
        assert!(err.message().contains(field), "{what} (stream): {err}");
    }
    assert!(stack.drained().await);
}

#[tokio::test]
async fn a_full_verifier_is_resource_exhausted_for_the_client() {
    let verifier = start_verifier(0).await;
    let router = start_router(&verifier, DraftSource::None, &fixture("target-full")).await;
    let mut client = specd_wire::generation::GenerationClient::new(router.channel().await);
    let err = generate(&mut client, ids_request(&PROMPT, 4))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
}

#[tokio::test]
async fn a_router_without_a_verifier_fails_to_start_and_says_why() {
    // Nothing listens on this port once the listener is dropped.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = GenerationService::connect(
        &VerifierSource::single(format!("http://127.0.0.1:{port}")),
        &DraftSource::None,
        TargetText::without_tokenizer(Vec::new()),
        RouterConfig::default(),
        std::time::Duration::from_millis(300),
    )
    .await
    .err()
    .expect("no verifier");
    assert!(err.to_string().contains("verifier"), "{err}");
}
