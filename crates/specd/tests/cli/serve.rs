//! `specd serve verifier|drafter|router` as an operator runs them: three processes on
//! 127.0.0.1, health SERVING on each, and the router's output equal to embedded decoding.

use crate::common::{fixture, json_of};
use crate::served::Service;

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use specd_wire::generation::{
    generate_request, GenerateRequest, GenerationClient, SamplingParams, SpeculativeParams,
    TokenIds,
};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

fn path(p: PathBuf) -> String {
    p.to_string_lossy().into_owned()
}

fn embedded(extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["generate", "--target"])
        .arg(fixture("target-full"))
        .args([
            "--no-draft",
            "--prompt-ids",
            "2,17,201,5,9",
            "--max-tokens",
            "32",
        ])
        .args(["--ignore-eos", "--json"])
        .args(extra)
        .output()
        .unwrap();
    json_of(out)
}

fn tokens(json: &Value) -> Vec<u32> {
    json["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

fn request(temperature: f32, seed: u64, block_size: u32) -> GenerateRequest {
    GenerateRequest {
        input: Some(generate_request::Input::PromptIds(TokenIds {
            ids: vec![2, 17, 201, 5, 9],
        })),
        max_tokens: Some(32),
        ignore_eos: true,
        sampling: Some(SamplingParams {
            temperature: Some(temperature),
            seed: Some(seed),
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

#[tokio::test]
async fn three_services_serve_and_speculate_losslessly() {
    let target = path(fixture("target-full"));
    let verifier = Service::start(&["verifier", "--target", &target]);
    let drafter = Service::start(&[
        "drafter",
        "--drafter",
        &path(fixture("assistant-dense")),
        "--target",
        &target,
    ]);
    let router = Service::start(&[
        "router",
        "--verifier",
        &verifier.url,
        "--drafters",
        &drafter.url,
        "--target",
        &target,
    ]);

    for (service, name) in [
        (&verifier, "specd.v1.Verifier"),
        (&drafter, "specd.v1.Drafter"),
        (&router, "specd.v1.Generation"),
    ] {
        let mut health = HealthClient::new(service.channel().await);
        let status = health
            .check(HealthCheckRequest {
                service: name.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status();
        assert_eq!(status, ServingStatus::Serving, "{name}");
    }

    let mut client = GenerationClient::new(router.channel().await);
    for (temperature, seed) in [(0.0, 0), (0.9, 4)] {
        let want = tokens(&embedded(&[
            "--temperature",
            &temperature.to_string(),
            "--seed",
            &seed.to_string(),
        ]));
        for block_size in [2, 5] {
            let response = client
                .generate(request(temperature, seed, block_size))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(
                response.token_ids, want,
                "t {temperature} seed {seed} bs {block_size}"
            );
            assert!(response.stats.unwrap().drafted > 0);
        }
    }
}

#[test]
fn a_router_without_a_verifier_exits_with_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["serve", "router", "--listen", "127.0.0.1:0"])
        .args([
            "--verifier",
            "http://127.0.0.1:9",
            "--connect-timeout-secs",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("verifier"), "{stderr}");
}
