//! Lossless speculative decoding on the real Qwen2.5-Coder 1.5B / 0.5B GGUF pair, embedded and
//! split over `specd serve verifier|drafter|router` processes: the draft-model and n-gram
//! drafters give exactly the target's own output, greedy and seeded. Skipped, loudly, when the
//! pair has not been fetched (tools/fetch_qwen_pair.sh).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::json_of;
use crate::served::Service;
use candle_core::quantized::gguf_file::{self, Value as GgufValue};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use serde_json::Value;
use specd_wire::generation::{
    generate_request, GenerateRequest, GenerateResponse, GenerationClient, SamplingParams,
    SpeculativeParams,
};
use tonic::transport::Channel;

const TARGET: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
const DRAFTER: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// Where tools/fetch_qwen_pair.sh and tools/fetch_smollm2.sh put their files.
pub(crate) fn model_dir() -> PathBuf {
    match std::env::var_os("SPECD_MODEL_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/specd/models")
        }
    }
}

pub(crate) fn pair() -> Option<(PathBuf, PathBuf)> {
    let dir = model_dir();
    let (t, d) = (dir.join(TARGET), dir.join(DRAFTER));
    if t.is_file() && d.is_file() {
        Some((t, d))
    } else {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: real Qwen pair not found in {}; run tools/fetch_qwen_pair.sh",
            dir.display()
        );
        None
    }
}

fn generate(target: &PathBuf, prompt: &str, extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["generate", "--target"])
        .arg(target)
        .args(["--prompt", prompt, "--max-tokens", "40", "--json"])
        .args(extra)
        .output()
        .unwrap();
    json_of(out)
}

#[test]
fn speculative_output_equals_plain_output_on_the_real_pair() {
    let Some((target, drafter)) = pair() else {
        return;
    };
    let drafter = drafter.to_str().unwrap();
    let cases: [(&str, &[&str], &str); 2] = [
        (
            "Write a Python function that checks whether a string is a palindrome.",
            &[],
            "4",
        ),
        (
            "Explain in two sentences what a hash map is.",
            &["--temperature", "0.8", "--seed", "7"],
            "3",
        ),
    ];
    for (prompt, sampling, block) in cases {
        let plain = generate(&target, prompt, &[&["--no-draft"], sampling].concat());
        let tokens = &plain["tokens"];
        assert!(tokens.as_array().unwrap().len() >= 8, "{plain}");
        let spec = generate(
            &target,
            prompt,
            &[
                &[
                    "--draft",
                    "draft-model",
                    "--drafter",
                    drafter,
                    "--block-size",
                    block,
                ],
                sampling,
            ]
            .concat(),
        );
        assert_eq!(
            &spec["tokens"], tokens,
            "draft-model output differs for {prompt:?}"
        );
        assert_eq!(spec["text"], plain["text"]);
        let accepted = spec["stats"]["accepted"].as_u64().unwrap();
        assert!(
            accepted > 0,
            "the 0.5B drafter should get drafts accepted: {spec}"
        );
        // The drafter's matrices as stored (the default re-encodes them to 4 bits) draft
        // differently, and the output is still the target's.
        let stored = generate(
            &target,
            prompt,
            &[
                &[
                    "--draft",
                    "draft-model",
                    "--drafter",
                    drafter,
                    "--draft-weights",
                    "stored",
                    "--block-size",
                    block,
                ],
                sampling,
            ]
            .concat(),
        );
        assert_eq!(
            &stored["tokens"], tokens,
            "stored drafter output differs for {prompt:?}"
        );
        assert!(
            stored["stats"]["accepted"].as_u64().unwrap() > 0,
            "{stored}"
        );
        let ngram = generate(
            &target,
            prompt,
            &[&["--draft", "ngram", "--block-size", block], sampling].concat(),
        );
        assert_eq!(
            &ngram["tokens"], tokens,
            "ngram output differs for {prompt:?}"
        );
    }
}

#[test]
fn token_trees_on_the_real_pair_emit_the_plain_output() {
    let Some((target, drafter)) = pair() else {
        return;
    };
    let drafter = drafter.to_str().unwrap();
    let prompt = "Write a short story about a lighthouse keeper who finds a message in a bottle.";
    let mut branch_drafts = 0;
    for sampling in [&[][..], &["--temperature", "0.8", "--seed", "3"][..]] {
        let plain = generate(&target, prompt, &[&["--no-draft"], sampling].concat());
        for (block, nodes) in [("3", "4"), ("5", "2")] {
            let flags = ["--draft", "draft-model", "--drafter", drafter];
            let shape = ["--block-size", block, "--tree-nodes", nodes];
            let spec = generate(&target, prompt, &[&flags[..], &shape, sampling].concat());
            assert_eq!(
                spec["tokens"], plain["tokens"],
                "trees of {nodes} branch drafts, block {block}, {sampling:?}: {spec}"
            );
            branch_drafts += spec["stats"]["tree_branch_drafts"].as_u64().unwrap();
        }
    }
    assert!(branch_drafts > 0, "no round branched");
}

#[test]
fn a_drafter_that_is_not_a_gguf_model_is_refused() {
    let Some((target, _)) = pair() else { return };
    // A safetensors file is not a GGUF draft model; the error says which model failed to load.
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/gemma4/target-full/model.safetensors");
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["generate", "--target"])
        .arg(&target)
        .args([
            "--prompt",
            "hi",
            "--max-tokens",
            "4",
            "--draft",
            "draft-model",
            "--drafter",
        ])
        .arg(&fixture)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("loading the drafter"), "{err}");
}

pub(crate) fn text(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A chat-formatted text prompt (the router applies no template; the special tokens encode
/// to single ids with the GGUF tokenizer).
fn chat(user: &str) -> String {
    format!(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
         assistant.<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )
}

fn request(prompt: &str, temperature: f32, seed: u64, block: Option<u32>) -> GenerateRequest {
    GenerateRequest {
        input: Some(generate_request::Input::Prompt(prompt.to_owned())),
        max_tokens: Some(40),
        sampling: Some(SamplingParams {
            temperature: Some(temperature),
            seed: Some(seed),
            ..SamplingParams::default()
        }),
        speculative: Some(SpeculativeParams {
            block_size: block,
            disabled: block.is_none(),
            ..Default::default()
        }),
        ..GenerateRequest::default()
    }
}

async fn generate_via(
    client: &mut GenerationClient<Channel>,
    request: GenerateRequest,
) -> GenerateResponse {
    client.generate(request).await.unwrap().into_inner()
}

/// A verifier of `target` and a drafter service of `drafter`.
pub(crate) fn pair_services(target: &Path, drafter: &Path) -> (Service, Service) {
    let verifier = Service::start(&["verifier", "--target", text(target)]);
    let drafter = Service::start(&[
        "drafter",
        "--drafter",
        text(drafter),
        "--target",
        text(target),
    ]);
    (verifier, drafter)
}

/// A router with its HTTP API over `verifier` and `drafter`, of `target`'s text.
pub(crate) fn pair_router(
    verifier: &Service,
    drafter: &Service,
    target: &Path,
) -> (Service, String) {
    Service::router_with_http(&[
        "--verifier",
        &verifier.url,
        "--drafters",
        &drafter.url,
        "--target",
        text(target),
    ])
}

#[tokio::test]
async fn split_services_on_the_real_pair_speculate_losslessly() {
    let Some((target, drafter)) = pair() else {
        return;
    };
    // One verifier shared by a draft-model router and an n-gram router.
    let (verifier, drafter) = pair_services(&target, &drafter);
    let routed = |extra: &[&str]| {
        let mut args = vec![
            "router",
            "--verifier",
            &verifier.url,
            "--target",
            text(&target),
        ];
        args.extend_from_slice(extra);
        Service::start(&args)
    };
    // Overlap forced on: on one machine `auto` starts without pre-drafting, and this checks
    // that pre-drafts are used and change nothing (chains only: a tree round is not
    // pre-drafted). Token trees are checked beside it.
    let draft_model = routed(&[
        "--drafters",
        &drafter.url,
        "--draft",
        "drafters",
        "--overlap",
        "on",
        "--tree-nodes",
        "0",
    ]);
    let trees = routed(&[
        "--drafters",
        &drafter.url,
        "--draft",
        "drafters",
        "--tree-nodes",
        "3",
    ]);
    let ngram = routed(&["--draft", "ngram"]);
    let mut draft_model = GenerationClient::new(draft_model.channel().await);
    let mut trees = GenerationClient::new(trees.channel().await);
    let mut ngram = GenerationClient::new(ngram.channel().await);

    let cases = [
        (
            chat("Write a Python function that checks whether a string is a palindrome."),
            0.0,
            0,
            4,
        ),
        (
            chat("Explain in two sentences what a hash map is."),
            0.8,
            7,
            3,
        ),
    ];
    for (prompt, temperature, seed, block) in cases {
        let plain = generate_via(&mut draft_model, request(&prompt, temperature, seed, None)).await;
        assert!(plain.token_ids.len() >= 8, "{plain:?}");
        assert!(!plain.text.contains("<|im_start|>"), "{:?}", plain.text);
        let spec = generate_via(
            &mut draft_model,
            request(&prompt, temperature, seed, Some(block)),
        )
        .await;
        assert_eq!(
            spec.token_ids, plain.token_ids,
            "draft-model output differs for t {temperature} seed {seed}"
        );
        assert_eq!(spec.text, plain.text);
        let stats = spec.stats.unwrap();
        assert!(stats.drafted > 0, "the drafter service was not used");
        assert!(
            stats.accepted > 0,
            "the 0.5B drafter should get drafts accepted: {stats:?}"
        );
        // Overlap on: the drafter pre-drafted every round but the first.
        assert!(
            stats.predraft_hits + stats.predraft_misses > 0,
            "no round asked for a pre-draft: {stats:?}"
        );
        if temperature == 0.0 {
            assert!(stats.predraft_hits > 0, "no pre-draft was used: {stats:?}");
        }
        let by_tree =
            generate_via(&mut trees, request(&prompt, temperature, seed, Some(block))).await;
        assert_eq!(
            by_tree.token_ids, plain.token_ids,
            "token-tree output differs for t {temperature} seed {seed}"
        );
        let stats = by_tree.stats.unwrap();
        // Each request tries trees in its first rounds.
        assert!(stats.tree_rounds > 0, "no tree round: {stats:?}");
        let by_ngram =
            generate_via(&mut ngram, request(&prompt, temperature, seed, Some(block))).await;
        assert_eq!(
            by_ngram.token_ids, plain.token_ids,
            "ngram output differs for t {temperature} seed {seed}"
        );
    }

    // A router whose verifier has another vocabulary (the tiny Gemma 4 fixture) does not use
    // the Qwen drafter: it decodes plainly instead of sending foreign token ids.
    let gemma = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/gemma4/target-full");
    let other = Service::start(&["verifier", "--target", text(&gemma)]);
    let mismatched = Service::start(&[
        "router",
        "--verifier",
        &other.url,
        "--drafters",
        &drafter.url,
        "--draft",
        "drafters",
    ]);
    let response = GenerationClient::new(mismatched.channel().await)
        .generate(GenerateRequest {
            input: Some(generate_request::Input::PromptIds(
                specd_wire::generation::TokenIds {
                    ids: vec![2, 17, 201, 5, 9],
                },
            )),
            max_tokens: Some(8),
            ignore_eos: true,
            speculative: Some(SpeculativeParams {
                block_size: Some(4),
                disabled: false,
                ..Default::default()
            }),
            ..GenerateRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.token_ids.len(), 8);
    let stats = response.stats.unwrap();
    assert_eq!(stats.drafted, 0, "a drafter of another vocabulary was used");
    assert!(stats.plain_rounds > 0, "{stats:?}");
}

#[tokio::test]
async fn openai_chat_on_the_real_pair_is_the_templated_prompt() {
    let Some((target, drafter)) = pair() else {
        return;
    };
    let (verifier, drafter) = pair_services(&target, &drafter);
    let (router, http) = pair_router(&verifier, &drafter, &target);
    let mut grpc = GenerationClient::new(router.channel().await);
    let user = "Write a Python function that checks whether a string is a palindrome.";
    // The Qwen template adds its default system turn, as chat() writes it.
    let by_text = generate_via(&mut grpc, request(&chat(user), 0.0, 0, Some(4))).await;
    let body = serde_json::json!({
        "model": TARGET,
        "messages": [{"role": "user", "content": user}],
        "max_tokens": 40,
        "temperature": 0,
        "specd": {"block_size": 4},
    });
    let http = http.clone();
    let (status, answer) = tokio::task::spawn_blocking(move || {
        crate::served::http_post(&http, "/v1/chat/completions", &body)
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        by_text.text.as_str()
    );
    assert!(!by_text.text.contains("<|im_end|>"));
    let stats = by_text.stats.unwrap();
    assert_eq!(answer["usage"]["prompt_tokens"], stats.prompt_tokens);
    assert!(
        answer["specd"]["accepted"].as_u64().unwrap() > 0,
        "{answer}"
    );
}

/// A GGUF holding only the metadata and token embedding a vocabulary check reads.
fn embedding_only_gguf(path: &Path, vocab: usize) {
    let embedding = Tensor::zeros((vocab, 8), candle_core::DType::F32, &Device::Cpu).unwrap();
    let embedding = QTensor::quantize(&embedding, GgmlDType::F32).unwrap();
    let arch = GgufValue::String("qwen2".into());
    let mut file = std::fs::File::create(path).unwrap();
    gguf_file::write(
        &mut file,
        &[("general.architecture", &arch)],
        &[("token_embd.weight", &embedding)],
    )
    .unwrap();
}

#[test]
fn a_drafter_whose_vocabulary_differs_from_the_target_is_refused() {
    let dir = std::env::temp_dir().join(format!("specd-vocab-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (target, drafter) = (dir.join("target.gguf"), dir.join("drafter.gguf"));
    embedding_only_gguf(&target, 96);
    embedding_only_gguf(&drafter, 64);
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["serve", "drafter", "--listen", "127.0.0.1:0", "--drafter"])
        .arg(&drafter)
        .arg("--target")
        .arg(&target)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("64 tokens"), "{err}");
    assert!(err.contains("96"), "{err}");
}

/// One chat turn over the one-process server's OpenAI API: the reply text and
/// the prompt tokens it took from the prefix cache.
fn chat_turn(http: &str, messages: &serde_json::Value) -> (String, u64) {
    let body = serde_json::json!({
        "messages": messages,
        "max_tokens": 24,
        "temperature": 0,
    });
    let (status, answer) = crate::served::http_post(http, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{answer}");
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    (text, cached)
}

#[test]
fn one_process_chat_turns_reuse_their_history_losslessly_on_the_real_pair() {
    let Some((target, drafter)) = pair() else {
        return;
    };
    let (target, drafter) = (target.to_str().unwrap(), drafter.to_str().unwrap());
    let (warm, warm_http) = Service::one_process(&["--target", target, "--drafter", drafter]);
    // Plain decoding without the prefix cache: the target alone, every prompt prefilled.
    let (cold, cold_http) =
        Service::one_process(&["--target", target, "--prefix-cache-bytes", "0"]);
    let _ = (&warm, &cold);
    let mut messages = vec![serde_json::json!({
        "role": "system",
        "content": "You are a careful reviewer of Python code. Answer in one short paragraph.",
    })];
    let questions = [
        "What does `sorted(set(xs))` return for xs = [3, 1, 3, 2]?",
        "And what if xs is empty?",
        "Is that faster than sorting first and removing duplicates after?",
    ];
    for (turn, question) in questions.iter().enumerate() {
        messages.push(serde_json::json!({"role": "user", "content": question}));
        let history = serde_json::Value::Array(messages.clone());
        let (text, cached) = chat_turn(&warm_http, &history);
        let (plain, plain_cached) = chat_turn(&cold_http, &history);
        assert_eq!(text, plain, "turn {turn}");
        assert_eq!(plain_cached, 0);
        if turn > 0 {
            // The history up to the last assistant reply was computed by the turn before.
            assert!(cached > 20, "turn {turn}: {cached}");
        }
        messages.push(serde_json::json!({"role": "assistant", "content": text}));
    }
}
