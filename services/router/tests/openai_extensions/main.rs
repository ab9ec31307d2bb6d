//! The OpenAI API's log probabilities, tools and router-checked fields end to end: real
//! router, verifier and drafter servers and a real HTTP client, on the tiny Gemma 4 target
//! with a word-level tokenizer (the router tests' stack).

// The router tests' support serves many tests; these use part of it.
#![allow(dead_code)]

#[path = "../router/support.rs"]
mod support;

#[path = "../router/openai_client.rs"]
mod openai_client;

#[path = "../../../drafter/tests/random_engine/mod.rs"]
mod random_engine;

use std::path::PathBuf;

use hyper::StatusCode;
use serde_json::{json, Value};

use openai_client::OpenAi;
use support::*;

/// A word-level target whose chat template shows what reached it in words: w3/w4/w6/w5
/// open system, user, assistant and tool turns; each tool definition adds w20, each earlier
/// call w21, a tool turn's name w22 when it has one.
fn tool_target() -> PathBuf {
    let (dir, _) = word_level_target("openai-extensions");
    let template = "{{ bos_token }} {% if tools %}{% for t in tools %}w20 {% endfor %}{% endif %}\
        {% for m in messages %}{% if m.role == 'system' %}w3{% elif m.role == 'user' %}w4\
        {% elif m.role == 'tool' %}w5{% if m.name %} w22{% endif %}{% else %}w6{% endif %} \
        {% if m.tool_calls %}{% for c in m.tool_calls %}w21 {% endfor %}{% endif %}\
        {{ m.content }} {{ eos_token }} {% endfor %}{% if add_generation_prompt %}w6{% endif %}";
    std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({"bos_token": "w2", "eos_token": "w7"}).to_string(),
    )
    .unwrap();
    dir
}

const WORDS: &str = "w40 w41 w42 w43 w9 w40 w41 w42 w43 w9 w40 w41";

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": WORDS}],
        "max_tokens": 12,
        "temperature": 0,
        "specd": {"block_size": 4},
    });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body
}

#[tokio::test]
async fn chat_logprobs_cover_every_token_whole_and_streamed() {
    let stack = Stack::start_in(Some(DrafterSetup::RandomMtp), &tool_target()).await;
    let http = OpenAi::new(stack.router.http.unwrap());
    let body = chat(json!({"logprobs": true, "top_logprobs": 3}));
    let (status, answer) = http.post("/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let content = answer["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        content.len() as u64,
        answer["usage"]["completion_tokens"].as_u64().unwrap()
    );
    for entry in &content {
        let token = entry["token"].as_str().unwrap();
        assert!(token.starts_with('w'), "{entry}");
        assert_eq!(entry["bytes"], json!(token.as_bytes()));
        let logprob = entry["logprob"].as_f64().unwrap();
        assert!(logprob <= 0.0, "{entry}");
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{entry}");
        // Greedy without bias or penalties draws the likeliest token.
        assert_eq!(top[0]["token"], entry["token"], "{entry}");
        assert!(top
            .windows(2)
            .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()));
    }
    assert_eq!(answer["specd"]["forced_drafted"], 0);

    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let (status, events) = http.stream("/v1/chat/completions", &streamed_body).await;
    assert_eq!(status, StatusCode::OK);
    let streamed: Vec<Value> = events
        .iter()
        .filter_map(|event| event["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(streamed, content);

    let (status, plain) = http.post("/v1/chat/completions", &chat(json!({}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(plain["choices"][0]["logprobs"], Value::Null);
    assert_eq!(
        plain["choices"][0]["message"]["content"],
        answer["choices"][0]["message"]["content"]
    );
}

#[tokio::test]
async fn legacy_completion_logprobs_list_tokens_and_offsets() {
    let stack = Stack::start_in(None, &tool_target()).await;
    let http = OpenAi::new(stack.router.http.unwrap());
    let body = json!({"prompt": WORDS, "max_tokens": 6, "temperature": 0, "logprobs": 2});
    let (status, answer) = http.post("/v1/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let logprobs = &answer["choices"][0]["logprobs"];
    let tokens = logprobs["tokens"].as_array().unwrap();
    assert_eq!(
        tokens.len() as u64,
        answer["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let offsets: Vec<u64> = logprobs["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    let mut expected = 0;
    for (token, offset) in tokens.iter().zip(&offsets) {
        assert_eq!(*offset, expected);
        expected += token.as_str().unwrap().chars().count() as u64;
    }
    for top in logprobs["top_logprobs"].as_array().unwrap() {
        assert!(!top.as_object().unwrap().is_empty());
    }
}

#[tokio::test]
async fn tools_and_earlier_calls_reach_the_chat_template() {
    let stack = Stack::start_in(None, &tool_target()).await;
    let http = OpenAi::new(stack.router.http.unwrap());
    let tool = |name: &str| json!({"type": "function", "function": {"name": name}});
    let conversation = json!([
        {"role": "user", "content": "w40"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": {"x": 1}}},
        ]},
        {"role": "tool", "tool_call_id": "call_a", "content": "w41"},
    ]);
    let prompt_tokens = |answer: &Value| answer["usage"]["prompt_tokens"].as_u64().unwrap();
    let (status, bare) = http
        .post(
            "/v1/chat/completions",
            &chat(json!({"messages": conversation, "max_tokens": 2})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{bare}");
    let (status, with_tools) = http
        .post(
            "/v1/chat/completions",
            &chat(
                json!({"messages": conversation, "max_tokens": 2, "tools": [tool("f"), tool("g")]}),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{with_tools}");
    // Two definitions, each a w20.
    assert_eq!(prompt_tokens(&with_tools), prompt_tokens(&bare) + 2);
    let (status, none) = http
        .post(
            "/v1/chat/completions",
            &chat(json!({
                "messages": conversation,
                "max_tokens": 2,
                "tools": [tool("f"), tool("g")],
                "tool_choice": "none",
            })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{none}");
    assert_eq!(prompt_tokens(&none), prompt_tokens(&bare));
    // BOS, user (w4 w40 w7), assistant (w6, two calls, w7), tool (w5, its name from the
    // call it answers, w41 w7), then the opened turn.
    assert_eq!(prompt_tokens(&bare), 1 + 3 + 4 + 4 + 1);
    // The model has no tool-call markup in its vocabulary: nothing to read as a call.
    let reason = &with_tools["choices"][0]["finish_reason"];
    assert!(reason == "length" || reason == "stop", "{with_tools}");
    assert!(with_tools["choices"][0]["message"]
        .get("tool_calls")
        .is_none());
}

#[tokio::test]
async fn the_routers_checks_name_the_clients_fields() {
    let stack = Stack::start_in(None, &tool_target()).await;
    let http = OpenAi::new(stack.router.http.unwrap());
    let cases = [
        (chat(json!({"presence_penalty": 3})), "presence_penalty"),
        (
            chat(json!({"frequency_penalty": -2.5})),
            "frequency_penalty",
        ),
        (chat(json!({"min_p": 2})), "min_p"),
        (chat(json!({"logit_bias": {"99999999": 1}})), "logit_bias"),
        (chat(json!({"logit_bias": {"5": 101}})), "logit_bias"),
        (chat(json!({"temperature": -1})), "temperature"),
        (chat(json!({"specd": {"lark": "start: ???"}})), "specd.lark"),
        (
            chat(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}}),
            ),
            "response_format",
        ),
    ];
    for (body, field) in cases {
        let (status, answer) = http.post("/v1/chat/completions", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["param"], field, "{body}: {answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with(field),
            "{body}: {answer}"
        );
    }
}
