//! The OpenAI surface past plain chat on the real Qwen2.5-Coder pair: JSON-schema, regex and
//! Lark constrained output, log probabilities, penalties and tool calls, each the same with
//! speculation on and off (one process, and split over gRPC where masks, rules and log
//! probabilities cross the wire), and bad formats refused with a 400 naming the field.
//! Skipped, loudly, when the pair has not been fetched.

use serde_json::{json, Value};
use specd_wire::generation::{
    generate_request, output_constraint, GenerateRequest, GenerationClient, OutputConstraint,
    SamplingParams, SpeculativeParams,
};

use crate::real_pair::{pair, pair_router, pair_services, text};
use crate::served::{http_post, Service};

const PERSON: &str = "Extract the person's details as JSON: Maria Lopez, 34, lives in Seville \
                      and can be reached at maria.lopez@example.com. She writes Rust and Python.";

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "email": {"type": "string"},
            "skills": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name", "age", "email", "skills"],
        "additionalProperties": false,
    })
}

fn chat(http: &str, body: Value) -> Value {
    let (status, answer) = http_post(http, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{answer}");
    answer
}

/// The request `body` three ways: plain, speculative without and with fast-forward.
fn three_ways(http: &str, body: &Value) -> [Value; 3] {
    let with = |specd: Value| {
        let mut body = body.clone();
        body["specd"] = specd;
        chat(http, body)
    };
    [
        with(json!({"speculative": false})),
        with(json!({"block_size": 4, "fast_forward": false})),
        with(json!({"block_size": 4})),
    ]
}

fn content(answer: &Value) -> &str {
    answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content: {answer}"))
}

#[test]
fn constrained_output_is_valid_and_lossless_on_the_real_pair() {
    let Some((target, drafter)) = pair() else {
        return;
    };
    let (_server, http) =
        Service::one_process(&["--target", text(&target), "--drafter", text(&drafter)]);
    for (temperature, seed) in [(0.0, 0), (0.8, 17)] {
        let body = json!({
            "messages": [{"role": "user", "content": PERSON}],
            "max_tokens": 96,
            "temperature": temperature,
            "seed": seed,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "person", "schema": person_schema()}},
        });
        let [plain, spec, forced] = three_ways(&http, &body);
        let case = format!("temperature {temperature}");
        assert_eq!(content(&spec), content(&plain), "{case}");
        assert_eq!(content(&forced), content(&plain), "{case}");
        let tokens = |answer: &Value| answer["usage"]["completion_tokens"].clone();
        assert_eq!(tokens(&spec), tokens(&plain), "{case}");
        assert_eq!(tokens(&forced), tokens(&plain), "{case}");
        let person: Value = serde_json::from_str(content(&plain))
            .unwrap_or_else(|e| panic!("{case}: not JSON ({e}): {}", content(&plain)));
        assert!(person["name"].is_string(), "{case}: {person}");
        assert!(person["age"].is_i64(), "{case}: {person}");
        assert!(person["email"].is_string(), "{case}: {person}");
        assert!(person["skills"].is_array(), "{case}: {person}");
        assert_eq!(person.as_object().unwrap().len(), 4, "{case}: {person}");
        assert_eq!(plain["choices"][0]["finish_reason"], "stop", "{case}");
        assert!(
            spec["specd"]["accepted"].as_u64().unwrap() > 0,
            "{case}: {spec}"
        );
        assert_eq!(spec["specd"]["forced_drafted"], 0, "{case}");
        assert!(
            forced["specd"]["forced_drafted"].as_u64().unwrap() > 0,
            "{case}: {forced}"
        );
    }

    // A regex (specd's extension) and a Lark grammar hold the whole output.
    let regex = json!({
        "messages": [{"role": "user", "content": "Give me a US phone number."}],
        "max_tokens": 24,
        "temperature": 0,
        "specd": {"regex": "\\([0-9]{3}\\) [0-9]{3}-[0-9]{4}"},
    });
    let phone = chat(&http, regex);
    let phone = content(&phone);
    assert_eq!(phone.len(), 14, "{phone}");
    assert!(
        phone.starts_with('(') && phone.as_bytes()[4] == b')',
        "{phone}"
    );
    let lark = json!({
        "messages": [{"role": "user", "content": "Is Rust memory safe? Answer yes or no."}],
        "max_tokens": 8,
        "temperature": 0,
        "specd": {"lark": "start: \"yes\" | \"no\""},
    });
    let answer = chat(&http, lark);
    assert!(["yes", "no"].contains(&content(&answer)), "{answer}");

    // Formats that cannot compile are the client's error, named.
    let cases = [
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}),
            None,
            "response_format",
        ),
        // Over the size limit (256 KiB of schema).
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema":
                {"type": "object", "description": "x".repeat(300 << 10)}}}),
            None,
            "response_format",
        ),
        (
            json!({"type": "text"}),
            Some(json!({"regex": "(unclosed"})),
            "specd.regex",
        ),
        (
            json!({"type": "text"}),
            Some(json!({"lark": "start: undefined_rule"})),
            "specd.lark",
        ),
    ];
    for (format, specd, field) in cases {
        let mut body = json!({
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 4,
            "response_format": format,
        });
        if let Some(specd) = specd {
            body["specd"] = specd;
        }
        let (status, answer) = http_post(&http, "/v1/chat/completions", &body);
        assert_eq!(status, 400, "{answer}");
        let param = answer["error"]["param"].as_str().unwrap_or_default();
        assert!(param.starts_with(field), "{field}: {answer}");
    }
}

#[test]
fn logprobs_and_penalties_are_the_same_with_speculation_on_the_real_pair() {
    let Some((target, drafter)) = pair() else {
        return;
    };
    let (_server, http) =
        Service::one_process(&["--target", text(&target), "--drafter", text(&drafter)]);
    let body = json!({
        "messages": [{"role": "user", "content": "Write a Python function that checks whether a string is a palindrome."}],
        "max_tokens": 48,
        "temperature": 0.7,
        "seed": 3,
        "logprobs": true,
        "top_logprobs": 3,
        "presence_penalty": 0.4,
        "frequency_penalty": 0.3,
        "repetition_penalty": 1.1,
        "min_p": 0.05,
        "logit_bias": {"13": -5},
    });
    let [plain, spec, _] = three_ways(&http, &body);
    assert_eq!(content(&spec), content(&plain));
    let logprobs = &plain["choices"][0]["logprobs"]["content"];
    assert_eq!(logprobs.as_array().unwrap().len(), 48, "{plain}");
    assert_eq!(
        spec["choices"][0]["logprobs"],
        plain["choices"][0]["logprobs"]
    );
    assert!(spec["specd"]["accepted"].as_u64().unwrap() > 0, "{spec}");
    let joined: String = logprobs
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["token"].as_str().unwrap())
        .collect();
    assert_eq!(joined, content(&plain));
    for token in logprobs.as_array().unwrap() {
        assert_eq!(token["top_logprobs"].as_array().unwrap().len(), 3);
        assert!(token["logprob"].as_f64().unwrap() <= 0.0);
    }

    // Penalties change the output (they are applied), and out-of-range ones are refused.
    let mut free = body.clone();
    for field in [
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "min_p",
        "logit_bias",
    ] {
        free.as_object_mut().unwrap().remove(field);
    }
    free["specd"] = json!({"speculative": false});
    assert_ne!(content(&chat(&http, free)), content(&plain));
    for (field, value) in [
        ("presence_penalty", json!(3)),
        ("top_logprobs", json!(21)),
        ("logit_bias", json!({"999999": 1})),
    ] {
        let mut bad = body.clone();
        bad[field] = value;
        let (status, answer) = http_post(&http, "/v1/chat/completions", &bad);
        assert_eq!(status, 400, "{field}: {answer}");
        assert_eq!(answer["error"]["param"], field, "{answer}");
    }
}

#[test]
fn a_forced_tool_call_round_trips_on_the_real_pair() {
    let Some((target, drafter)) = pair() else {
        return;
    };
    let (_server, http) =
        Service::one_process(&["--target", text(&target), "--drafter", text(&drafter)]);
    let tools = json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"},
                               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["city"],
            },
        },
    }]);
    let question = json!({"role": "user", "content": "What's the weather in Paris right now?"});
    let call = chat(
        &http,
        json!({
            "messages": [question],
            "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": 64,
            "temperature": 0,
        }),
    );
    let choice = &call["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{call}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{call}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let arguments: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["city"].is_string(), "{arguments}");
    // The call and the tool's answer go back; with tool_choice none the model answers.
    let answer = chat(
        &http,
        json!({
            "messages": [
                question,
                {"role": "assistant", "content": null, "tool_calls": calls},
                {"role": "tool", "tool_call_id": calls[0]["id"],
                 "content": "{\"temperature\": 18, \"unit\": \"celsius\", \"sky\": \"cloudy\"}"},
            ],
            "tools": tools,
            "tool_choice": "none",
            "max_tokens": 40,
            "temperature": 0,
        }),
    );
    assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{answer}");
    assert!(!content(&answer).is_empty(), "{answer}");
    let (status, refused) = http_post(
        &http,
        "/v1/chat/completions",
        &json!({
            "messages": [{"role": "user", "content": "x"}],
            "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "no_such_tool"}},
        }),
    );
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["param"], "tool_choice", "{refused}");
}

/// Over the split services the masks, rules and log probabilities cross gRPC.
#[tokio::test]
async fn split_services_keep_constrained_and_shaped_output_lossless_on_the_real_pair() {
    let Some((target, drafter)) = pair() else {
        return;
    };
    let (verifier, drafter) = pair_services(&target, &drafter);
    let (router, _http) = pair_router(&verifier, &drafter, &target);
    let mut client = GenerationClient::new(router.channel().await);
    let request = |speculative: bool| GenerateRequest {
        input: Some(generate_request::Input::Prompt(format!(
            "<|im_start|>user\n{PERSON}<|im_end|>\n<|im_start|>assistant\n"
        ))),
        max_tokens: Some(80),
        sampling: Some(SamplingParams {
            temperature: Some(0.6),
            seed: Some(5),
            presence_penalty: Some(0.3),
            logit_bias: [(11, 1.5)].into_iter().collect(),
            ..Default::default()
        }),
        top_logprobs: Some(2),
        constraint: Some(OutputConstraint {
            kind: Some(output_constraint::Kind::JsonSchema(
                person_schema().to_string(),
            )),
        }),
        speculative: Some(SpeculativeParams {
            disabled: !speculative,
            block_size: speculative.then_some(4),
            ..Default::default()
        }),
        ..GenerateRequest::default()
    };
    let plain = client.generate(request(false)).await.unwrap().into_inner();
    let spec = client.generate(request(true)).await.unwrap().into_inner();
    assert_eq!(spec.token_ids, plain.token_ids);
    assert_eq!(spec.logprobs, plain.logprobs);
    assert_eq!(plain.logprobs.len(), plain.token_ids.len());
    serde_json::from_str::<Value>(&plain.text).unwrap_or_else(|e| panic!("{e}: {}", plain.text));
    let stats = spec.stats.unwrap();
    assert!(stats.drafted > 0, "{stats:?}");
}
