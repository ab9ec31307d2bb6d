//! `specd serve` with no service name: router, verifier and drafter in one process, serving
//! the gRPC and OpenAI APIs with the output of embedded decoding, speculating, batching
//! concurrent requests and reusing cached prompt prefixes across a conversation's turns.

use std::process::Command;

use serde_json::{json, Value};
use specd_wire::generation::{
    generate_request, GenerateRequest, GenerationClient, SamplingParams, SpeculativeParams,
    TokenIds,
};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::common::{fixture, json_of};
use crate::served::{http_post, Service};

fn path(name: &str) -> String {
    fixture(name).to_string_lossy().into_owned()
}

/// `specd generate --no-draft` of `prompt`: the target alone, in this process.
fn embedded(prompt: &[u32], max_tokens: u32, temperature: f32, seed: u64) -> Vec<u32> {
    let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["generate", "--target", &path("target-full"), "--no-draft"])
        .args(["--prompt-ids", &ids.join(",")])
        .args([
            "--max-tokens",
            &max_tokens.to_string(),
            "--ignore-eos",
            "--json",
        ])
        .args(["--temperature", &temperature.to_string()])
        .args(["--seed", &seed.to_string()])
        .output()
        .unwrap();
    json_of(out)["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

fn request(
    prompt: &[u32],
    max_tokens: u32,
    temperature: f32,
    seed: u64,
    block: u32,
) -> GenerateRequest {
    GenerateRequest {
        input: Some(generate_request::Input::PromptIds(TokenIds {
            ids: prompt.to_vec(),
        })),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        sampling: Some(SamplingParams {
            temperature: Some(temperature),
            seed: Some(seed),
            ..SamplingParams::default()
        }),
        speculative: Some(SpeculativeParams {
            block_size: Some(block),
            disabled: false,
            ..Default::default()
        }),
        ..GenerateRequest::default()
    }
}

const PROMPT: [u32; 5] = [2, 17, 201, 5, 9];

#[tokio::test]
async fn one_process_serves_grpc_and_http_and_speculates_losslessly() {
    let (server, http) = Service::one_process(&[
        "--target",
        &path("target-full"),
        "--drafter",
        &path("assistant-dense"),
    ]);
    let mut health = HealthClient::new(server.channel().await);
    let status = health
        .check(HealthCheckRequest {
            service: "specd.v1.Generation".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status();
    assert_eq!(status, ServingStatus::Serving);
    let mut client = GenerationClient::new(server.channel().await);
    for (temperature, seed) in [(0.0, 0), (0.9, 4)] {
        let want = embedded(&PROMPT, 32, temperature, seed);
        for block in [2, 5] {
            let response = client
                .generate(request(&PROMPT, 32, temperature, seed, block))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(response.token_ids, want, "t {temperature} bs {block}");
            assert!(response.stats.unwrap().drafted > 0);
        }
    }
    // Concurrent requests share the verifier's batches and each gets its own answer.
    let prompts: Vec<Vec<u32>> = (0..4u32).map(|i| vec![2, 17 + i, 201, 5, 9 + i]).collect();
    let runs: Vec<_> = prompts
        .iter()
        .map(|prompt| {
            let mut client = client.clone();
            let request = request(prompt, 16, 0.0, 0, 4);
            tokio::spawn(async move { client.generate(request).await.unwrap().into_inner() })
        })
        .collect();
    for (prompt, run) in prompts.iter().zip(runs) {
        let answer = run.await.unwrap();
        assert_eq!(answer.token_ids, embedded(prompt, 16, 0.0, 0));
    }
    let (status, body) = http_post(
        &http,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "specd": {"ignore_eos": true}}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 8);
    assert_eq!(body["usage"]["prompt_tokens"], 5);
    let (status, models) = get(&http, "/v1/models");
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "target-full");
}

#[tokio::test]
async fn one_process_turns_reuse_the_conversation_prefix() {
    // Prefix reuse on this target is in whole prefill pieces of 512 tokens.
    let (server, _) = Service::one_process(&["--target", &path("target-full"), "--draft", "ngram"]);
    let (cold, _) = Service::one_process(&[
        "--target",
        &path("target-full"),
        "--draft",
        "ngram",
        "--prefix-cache-bytes",
        "0",
    ]);
    let mut warm = GenerationClient::new(server.channel().await);
    let mut cold = GenerationClient::new(cold.channel().await);
    let mut prompt: Vec<u32> = (0..600u32).map(|i| (i * 37 + 11) % 250 + 2).collect();
    for turn in 0..3u32 {
        let ask = request(&prompt, 12, 0.7, 9, 4);
        let got = warm.generate(ask.clone()).await.unwrap().into_inner();
        let want = cold.generate(ask).await.unwrap().into_inner();
        assert_eq!(got.token_ids, want.token_ids, "turn {turn}");
        let cached = got.stats.unwrap().cached_prompt_tokens;
        assert_eq!(want.stats.unwrap().cached_prompt_tokens, 0);
        assert_eq!(cached, if turn == 0 { 0 } else { 512 }, "turn {turn}");
        prompt.extend(&got.token_ids);
        prompt.extend([40 + turn, 41, 42]);
    }
}

#[test]
fn serve_without_a_target_or_service_says_what_is_missing() {
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--target"), "{stderr}");
}

/// Each service names the model families it takes: a checkpoint of another role is refused
/// naming what it is, before anything is loaded or bound.
#[test]
fn services_refuse_a_checkpoint_of_the_wrong_role() {
    let serve = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_specd"))
            .arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let assistant = fixture("assistant-dense");
    let target = fixture("target-full");
    let (assistant, target) = (assistant.to_str().unwrap(), target.to_str().unwrap());
    let stderr = serve(&["verifier", "--target", assistant]);
    assert!(
        stderr.contains("a Gemma 4 assistant (a drafter), not a target"),
        "{stderr}"
    );
    let stderr = serve(&["drafter", "--drafter", target, "--target", target]);
    assert!(
        stderr.contains("a Gemma 4 target checkpoint, not a drafter"),
        "{stderr}"
    );
}

fn get(addr: &str, path: &str) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut socket = std::net::TcpStream::connect(addr).unwrap();
    write!(
        socket,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    socket.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap())
}
