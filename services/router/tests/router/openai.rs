//! The OpenAI-compatible HTTP API end to end: real router, verifier and drafter servers, a
//! real HTTP client, the tiny Gemma 4 target with a word-level tokenizer and a chat template.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use hyper::StatusCode;
use serde_json::{json, Value};
use specd_wire::generation::{
    generate_request, ChatMessage, ChatMessages, FinishReason, GenerateRequest,
};

use crate::openai_client::OpenAi;
use crate::support::*;

/// The word that ends an assistant turn in the test chat format.
const END_OF_TURN: &str = "w7";

/// A word-level target directory (see `word_level_target`) with a chat template and a
/// tokenizer_config.json naming the end-of-turn token.
fn chat_target() -> PathBuf {
    let (dir, _) = word_level_target("openai");
    // Roles become w3 (system), w4 (user), w6 (assistant); the reply opens with w6, and with
    // w8 after it when a request sets the template variable extra_word.
    let template = "{{ bos_token }} {% for m in messages %}{% if m.role == 'system' %}w3{% elif m.role == 'user' %}w4{% else %}w6{% endif %} {{ m.content }} {{ eos_token }} {% endfor %}{% if add_generation_prompt %}w6{% if extra_word %} w8{% endif %}{% endif %}";
    std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({"bos_token": "w2", "eos_token": END_OF_TURN}).to_string(),
    )
    .unwrap();
    dir
}

const WORDS: &str = "w40 w41 w42 w43 w9 w40 w41 w42 w43 w9 w40 w41";

fn chat_body(max_tokens: u32, temperature: f32, seed: u64) -> Value {
    json!({
        "model": SERVED_MODEL,
        "messages": [
            {"role": "system", "content": "w11 w12"},
            {"role": "user", "content": WORDS},
        ],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "specd": {"block_size": 4},
    })
}

fn grpc_chat(max_tokens: u32, temperature: f32, seed: u64) -> GenerateRequest {
    let message = |role: &str, content: &str| ChatMessage {
        role: role.into(),
        content: content.into(),
        ..Default::default()
    };
    let request = GenerateRequest {
        input: Some(generate_request::Input::Messages(ChatMessages {
            messages: vec![message("system", "w11 w12"), message("user", WORDS)],
            template_variables_json: String::new(),
        })),
        max_tokens: Some(max_tokens),
        ..GenerateRequest::default()
    };
    with_block(sampled(request, temperature, seed), Some(4), false)
}

fn chat_text(answer: &Value) -> &str {
    answer["choices"][0]["message"]["content"].as_str().unwrap()
}

#[tokio::test]
async fn chat_over_http_equals_the_grpc_chat_request() {
    let dir = chat_target();
    let stack = Stack::start_in(Some(DrafterSetup::RandomMtp), &dir).await;
    let http = OpenAi::new(stack.router.http.unwrap());
    let mut grpc = stack.client().await;
    for (temperature, seed) in [(0.0, 0), (0.9, 11)] {
        let by_grpc = generate(&mut grpc, grpc_chat(40, temperature, seed))
            .await
            .unwrap();
        let (status, answer) = http
            .post("/v1/chat/completions", &chat_body(40, temperature, seed))
            .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(chat_text(&answer), by_grpc.text, "t {temperature}");
        assert_eq!(answer["object"], "chat.completion");
        assert_eq!(answer["model"], SERVED_MODEL);
        assert_eq!(answer["choices"][0]["message"]["role"], "assistant");
        let stats = by_grpc.stats.clone().unwrap();
        assert_eq!(answer["usage"]["prompt_tokens"], stats.prompt_tokens);
        assert_eq!(
            answer["usage"]["completion_tokens"],
            stats.completion_tokens
        );
        assert_eq!(
            answer["usage"]["total_tokens"],
            stats.prompt_tokens + stats.completion_tokens
        );
        assert_eq!(answer["specd"]["seed"], seed);
        let reason = match by_grpc.finish_reason() {
            FinishReason::Length => "length",
            _ => "stop",
        };
        assert_eq!(answer["choices"][0]["finish_reason"], reason);

        // The template opened the assistant's turn: the prompt is BOS, the system and user
        // turns each closed by the end-of-turn word, then w6.
        assert_eq!(stats.prompt_tokens, 1 + (1 + 2 + 1) + (1 + 12 + 1) + 1);
        // The reply ends at the end-of-turn token, whichever comes first.
        let turn_end = by_grpc.token_ids.iter().position(|&t| t == 7);
        match turn_end {
            Some(at) => {
                assert_eq!(at + 1, by_grpc.token_ids.len());
                assert_eq!(by_grpc.finish_reason(), FinishReason::Eos);
            }
            None => assert_eq!(by_grpc.token_ids.len(), 40),
        }

        // Streamed: the role first, deltas adding up to the same text, the finish reason,
        // the usage chunk, then [DONE].
        let mut body = chat_body(40, temperature, seed);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let (status, events) = http.stream("/v1/chat/completions", &body).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(events.last().unwrap(), "[DONE]");
        assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
        let chunks = &events[..events.len() - 1];
        let id = &chunks[0]["id"];
        assert!(id.as_str().unwrap().starts_with("chatcmpl-"));
        assert!(chunks
            .iter()
            .all(|c| &c["id"] == id && c["object"] == "chat.completion.chunk"));
        let streamed: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(streamed, by_grpc.text);
        let finish = &chunks[chunks.len() - 2];
        assert_eq!(finish["choices"][0]["finish_reason"], reason);
        let usage = &chunks[chunks.len() - 1];
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], stats.completion_tokens);
    }
    assert!(stack.drained().await);
}

#[tokio::test]
async fn text_completions_over_http_equal_grpc_prompt_requests() {
    let dir = chat_target();
    let stack = Stack::start_in(Some(DrafterSetup::Ngram), &dir).await;
    let http = OpenAi::new(stack.router.http.unwrap());
    let mut grpc = stack.client().await;
    let prompt = format!("w2 {WORDS}");
    let by_grpc = generate(
        &mut grpc,
        sampled(
            GenerateRequest {
                input: Some(generate_request::Input::Prompt(prompt.clone())),
                max_tokens: Some(24),
                ignore_eos: true,
                ..GenerateRequest::default()
            },
            0.8,
            5,
        ),
    )
    .await
    .unwrap();
    let body = json!({
        "prompt": prompt,
        "max_tokens": 24,
        "temperature": 0.8,
        "seed": 5,
        "specd": {"ignore_eos": true},
    });
    let (status, answer) = http.post("/v1/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["object"], "text_completion");
    assert_eq!(answer["choices"][0]["text"], by_grpc.text.as_str());
    assert_eq!(answer["choices"][0]["finish_reason"], "length");
    assert_eq!(answer["usage"]["completion_tokens"], 24);

    // Token ids as the prompt, streamed.
    let ids: Vec<u32> = [2u32, 40, 41, 42, 43, 9, 40, 41, 42, 43, 9, 40, 41].to_vec();
    let body = json!({
        "prompt": ids,
        "max_tokens": 24,
        "temperature": 0.8,
        "seed": 5,
        "stream": true,
        "specd": {"ignore_eos": true},
    });
    let (status, events) = http.stream("/v1/completions", &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let streamed: String = events[..events.len() - 1]
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, by_grpc.text);
}

#[tokio::test]
async fn chat_template_kwargs_reach_the_template() {
    let dir = chat_target();
    let stack = Stack::start_in(None, &dir).await;
    let http = OpenAi::new(stack.router.http.unwrap());
    let body = |kwargs: Value| {
        json!({
            "messages": [{"role": "user", "content": "w5"}],
            "max_tokens": 2,
            "temperature": 0,
            "chat_template_kwargs": kwargs,
        })
    };
    let prompt_tokens = |answer: &Value| answer["usage"]["prompt_tokens"].as_u64().unwrap();
    let (status, plain) = http.post("/v1/chat/completions", &body(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{plain}");
    let (status, extra) = http
        .post("/v1/chat/completions", &body(json!({"extra_word": true})))
        .await;
    assert_eq!(status, StatusCode::OK, "{extra}");
    // w2, w4 w5, the end of turn, w6; then w8 as well.
    assert_eq!(prompt_tokens(&plain), 5, "{plain}");
    assert_eq!(prompt_tokens(&extra), 6, "{extra}");
    assert_eq!(stack.live_sequences().await, 0);
}

#[tokio::test]
async fn bad_requests_get_openai_errors_naming_the_field() {
    let dir = chat_target();
    let stack = Stack::start_in(None, &dir).await;
    let http = OpenAi::new(stack.router.http.unwrap());
    let user = json!([{"role": "user", "content": "w5"}]);
    let cases = [
        (
            "/v1/chat/completions",
            json!({"messages": user, "n": 2}),
            400,
            "n",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "max_tokens": 0}),
            400,
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "max_tokens": 5000}),
            400,
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "temperature": -1}),
            400,
            "temperature",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "top_p": "all"}),
            400,
            "top_p",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": []}),
            400,
            "messages",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "", "content": "w5"}]}),
            400,
            "messages[0].role",
        ),
        (
            "/v1/chat/completions",
            json!({"max_tokens": 3}),
            400,
            "messages",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "stop": [""]}),
            400,
            "stop[0]",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "model": "gpt-4"}),
            404,
            "model",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "chat_template_kwargs": 5}),
            400,
            "chat_template_kwargs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "chat_template_kwargs": {"bos_token": "w9"}}),
            400,
            "messages.template_variables_json",
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2, 99999]}),
            400,
            "prompt_ids[2]",
        ),
        ("/v1/completions", json!({"prompt": ""}), 400, "prompt"),
        (
            "/v1/completions",
            json!({"prompt": ["w5", "w6"]}),
            400,
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"prompt": "w5", "echo": true}),
            400,
            "echo",
        ),
    ];
    for (path, body, status, field) in cases {
        let (got, answer) = http.post(path, &body).await;
        assert_eq!(got.as_u16(), status, "{body}: {answer}");
        let error = &answer["error"];
        assert_eq!(error["param"], field, "{body}: {answer}");
        assert!(
            error["message"].as_str().unwrap().contains(field),
            "{body}: {answer}"
        );
        assert!(error["type"].is_string());
    }
    let (status, answer) = http
        .post_raw("/v1/chat/completions", "{\"messages\": [")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(answer["error"]["param"], "body");
    let (status, answer) = http.get("/v1/nothing").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");

    let (status, models) = http.get("/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(models["data"][0]["id"], SERVED_MODEL);
    let (status, _) = http.get(&format!("/v1/models/{SERVED_MODEL}")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, health) = http.get("/health").await;
    assert_eq!((status, &health["status"]), (StatusCode::OK, &json!("ok")));

    // Nothing was admitted, nothing is left.
    assert_eq!(stack.live_sequences().await, 0);
}

/// Sends `body` to `path` on a bare socket, waits until the verifier holds the request's
/// sequence, then vanishes.
async fn vanish_mid_request(stack: &Stack, path: &str, body: Value) {
    let addr = stack.router.http.unwrap();
    let body = body.to_string();
    let mut socket = std::net::TcpStream::connect(addr).unwrap();
    write!(
        socket,
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut live = false;
    for _ in 0..400 {
        if stack.live_sequences().await > 0 {
            live = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(live, "the request never reached the verifier");
    socket
        .set_read_timeout(Some(Duration::from_millis(1)))
        .unwrap();
    let _ = socket.read(&mut [0u8; 64]);
    drop(socket);
}

#[tokio::test]
async fn a_client_that_disconnects_frees_its_sequence_and_session() {
    let dir = chat_target();
    let stack = Stack::start_in(Some(DrafterSetup::RandomMtp), &dir).await;
    let http = OpenAi::new(stack.router.http.unwrap());
    let long = |stream: bool| {
        json!({
            "prompt": [2, 40, 41, 42, 43, 9],
            "max_tokens": 1000,
            "temperature": 0,
            "stream": stream,
            "specd": {"ignore_eos": true, "block_size": 4},
        })
    };
    for stream in [true, false] {
        vanish_mid_request(&stack, "/v1/completions", long(stream)).await;
        let vanished = std::time::Instant::now();
        assert!(
            stack.drained().await,
            "stream {stream}: left behind {} sequences, {} sessions",
            stack.live_sequences().await,
            stack.live_sessions().await
        );
        let freed_after = vanished.elapsed();
        // The same request run to its end takes longer than the abandoned one took to be
        // freed: it was cancelled, not left to finish.
        let started = std::time::Instant::now();
        let (status, answer) = http.post("/v1/completions", &long(false)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer["usage"]["completion_tokens"], 1000);
        let full = started.elapsed();
        assert!(
            freed_after < full,
            "stream {stream}: freed after {freed_after:?}, a whole request takes {full:?}"
        );
    }
}
