//! OpenAI request bodies, checked and turned into the public gRPC request, so HTTP and gRPC
//! share one validation, one round loop and one set of limits.

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use specd_wire::generation::{
    generate_request, ChatMessage, ChatMessages, GenerateRequest, SamplingParams,
    SpeculativeParams, TokenIds,
};

use super::error::ApiError;

/// The OpenAI default temperature: a request that leaves it out samples at 1.
const DEFAULT_TEMPERATURE: f32 = 1.0;

/// What chat and text completions share.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CommonParams {
    pub model: Option<String>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Not OpenAI's, but vLLM's and many clients': -1 or 0 leaves top-k off.
    pub top_k: Option<i64>,
    pub seed: Option<u64>,
    pub stop: Option<StopField>,
    pub n: Option<u32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    pub top_logprobs: Option<u32>,
    /// vLLM's: only requests with the same salt share cached prompt prefixes.
    pub cache_salt: Option<String>,
    /// specd's own settings.
    pub specd: Option<SpecdParams>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// The `specd` extension object of a request.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpecdParams {
    /// Verify block size (1 decodes plainly); unset: the adaptive policy.
    pub block_size: Option<u32>,
    /// `false` decodes without a drafter.
    pub speculative: Option<bool>,
    /// Keep generating past end-of-sequence tokens (benchmarks).
    pub ignore_eos: bool,
}

#[derive(Debug, Deserialize)]
struct ChatBody {
    messages: Vec<InMessage>,
    /// More variables for the chat template (vLLM's name), e.g. `{"enable_thinking": true}`.
    #[serde(default)]
    chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    response_format: Option<ResponseFormat>,
}

#[derive(Debug, Deserialize)]
struct ResponseFormat {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Debug, Deserialize)]
struct InMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct CompletionBody {
    prompt: PromptField,
    #[serde(default)]
    echo: Option<bool>,
    #[serde(default)]
    suffix: Option<String>,
    #[serde(default)]
    best_of: Option<u32>,
    #[serde(default)]
    logprobs: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

/// A checked completion request: the gRPC request to run and how to answer.
#[derive(Debug)]
pub struct Completion {
    pub request: GenerateRequest,
    pub model: Option<String>,
    pub stream: bool,
    pub include_usage: bool,
}

/// The JSON object of a request body.
pub fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::field("body", format!("not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::field("body", "must be a JSON object"));
    }
    Ok(value)
}

/// `value` as `T`, an error naming the field that does not fit.
fn typed<T: DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let reason = e.into_inner().to_string();
        // A missing field is reported at its parent: name the field itself.
        let missing = reason
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split_once('`'))
            .map(|(name, _)| name.to_owned());
        let field = match (path.as_str(), missing) {
            (".", Some(name)) => name,
            (".", None) => "body".to_owned(),
            (_, Some(name)) => format!("{path}.{name}"),
            (_, None) => path,
        };
        ApiError::field(field, reason)
    })
}

/// `POST /v1/chat/completions`.
pub fn chat(value: &Value) -> Result<Completion, ApiError> {
    let common: CommonParams = typed(value)?;
    let body: ChatBody = typed(value)?;
    if body.logprobs == Some(true) {
        return Err(ApiError::field(
            "logprobs",
            "log probabilities are not supported",
        ));
    }
    if body.tools.as_ref().is_some_and(|tools| !tools.is_empty()) {
        return Err(ApiError::field("tools", "tool calling is not supported"));
    }
    if let Some(format) = &body.response_format {
        if format.kind != "text" {
            return Err(ApiError::field(
                "response_format.type",
                format!("only \"text\" is supported, not {:?}", format.kind),
            ));
        }
    }
    let messages = body
        .messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| {
            Ok(ChatMessage {
                role: message.role,
                content: content_text(i, message.content)?,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let template_variables_json = match &body.chat_template_kwargs {
        Some(variables) if !variables.is_empty() => Value::Object(variables.clone()).to_string(),
        _ => String::new(),
    };
    let input = generate_request::Input::Messages(ChatMessages {
        messages,
        template_variables_json,
    });
    completion(common, input)
}

/// `POST /v1/completions`.
pub fn text(value: &Value) -> Result<Completion, ApiError> {
    let common: CommonParams = typed(value)?;
    let body: CompletionBody = typed(value)?;
    if body.echo == Some(true) {
        return Err(ApiError::field(
            "echo",
            "echoing the prompt is not supported",
        ));
    }
    if body.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::field("suffix", "suffixes are not supported"));
    }
    if body.best_of.is_some_and(|n| n != 1) {
        return Err(ApiError::field("best_of", "only 1 is supported"));
    }
    if body.logprobs.is_some() {
        return Err(ApiError::field(
            "logprobs",
            "log probabilities are not supported",
        ));
    }
    let one = |n: usize| {
        if n == 1 {
            Ok(())
        } else {
            Err(ApiError::field(
                "prompt",
                format!("one prompt per request, found {n} (send each as its own request)"),
            ))
        }
    };
    let input = match body.prompt {
        PromptField::Text(text) => generate_request::Input::Prompt(text),
        PromptField::Ids(ids) => generate_request::Input::PromptIds(TokenIds { ids }),
        PromptField::Texts(mut texts) => {
            one(texts.len())?;
            generate_request::Input::Prompt(texts.remove(0))
        }
        PromptField::IdLists(mut lists) => {
            one(lists.len())?;
            generate_request::Input::PromptIds(TokenIds {
                ids: lists.remove(0),
            })
        }
    };
    completion(common, input)
}

fn content_text(index: usize, content: Option<Content>) -> Result<String, ApiError> {
    match content {
        None => Ok(String::new()),
        Some(Content::Text(text)) => Ok(text),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.into_iter().enumerate() {
                if part.kind != "text" {
                    return Err(ApiError::field(
                        format!("messages[{index}].content[{j}].type"),
                        format!("only \"text\" parts are supported, not {:?}", part.kind),
                    ));
                }
                text.push_str(&part.text.unwrap_or_default());
            }
            Ok(text)
        }
    }
}

fn completion(
    common: CommonParams,
    input: generate_request::Input,
) -> Result<Completion, ApiError> {
    if common.n.is_some_and(|n| n != 1) {
        return Err(ApiError::field(
            "n",
            "only 1 completion per request is supported",
        ));
    }
    for (field, value) in [
        ("presence_penalty", common.presence_penalty),
        ("frequency_penalty", common.frequency_penalty),
    ] {
        if value.is_some_and(|v| v != 0.0) {
            return Err(ApiError::field(
                field,
                "penalties are not supported (only 0)",
            ));
        }
    }
    if common
        .logit_bias
        .as_ref()
        .is_some_and(|bias| !bias.is_empty())
    {
        return Err(ApiError::field(
            "logit_bias",
            "logit biases are not supported",
        ));
    }
    if common.top_logprobs.is_some_and(|n| n > 0) {
        return Err(ApiError::field(
            "top_logprobs",
            "log probabilities are not supported",
        ));
    }
    let top_k = match common.top_k {
        None | Some(-1) | Some(0) => None,
        Some(k) => Some(u32::try_from(k).map_err(|_| {
            ApiError::field("top_k", format!("{k} is not -1, 0 or a positive count"))
        })?),
    };
    let stop = match common.stop {
        None => Vec::new(),
        Some(StopField::One(stop)) => vec![stop],
        Some(StopField::Many(stops)) => stops,
    };
    let specd = common.specd.unwrap_or_default();
    let speculative = SpeculativeParams {
        block_size: specd.block_size,
        disabled: specd.speculative == Some(false),
    };
    let request = GenerateRequest {
        input: Some(input),
        max_tokens: common.max_completion_tokens.or(common.max_tokens),
        ignore_eos: specd.ignore_eos,
        stop,
        sampling: Some(SamplingParams {
            temperature: Some(common.temperature.unwrap_or(DEFAULT_TEMPERATURE)),
            top_p: common.top_p,
            top_k,
            seed: common.seed,
        }),
        speculative: Some(speculative),
        cache_salt: common.cache_salt.unwrap_or_default(),
    };
    Ok(Completion {
        request,
        model: common.model,
        stream: common.stream.unwrap_or(false),
        include_usage: common
            .stream_options
            .and_then(|options| options.include_usage)
            .unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_chat_request_becomes_a_messages_request() {
        let value = json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]},
            ],
            "max_completion_tokens": 7,
            "max_tokens": 99,
            "temperature": 0,
            "seed": 5,
            "stop": "END",
            "stream": true,
            "stream_options": {"include_usage": true},
            "user": "ignored",
            "specd": {"block_size": 3},
        });
        let chat = chat(&value).unwrap();
        assert!(chat.stream && chat.include_usage);
        assert_eq!(chat.model.as_deref(), Some("m"));
        let request = chat.request;
        assert_eq!(request.max_tokens, Some(7));
        assert_eq!(request.stop, ["END"]);
        let sampling = request.sampling.unwrap();
        assert_eq!((sampling.temperature, sampling.seed), (Some(0.0), Some(5)));
        assert_eq!(request.speculative.unwrap().block_size, Some(3));
        let Some(generate_request::Input::Messages(chat)) = request.input else {
            panic!("not a chat request");
        };
        assert_eq!(chat.messages[1].content, "Hi!");
    }

    #[test]
    fn unset_temperature_is_openais_default() {
        let value = json!({"prompt": "x"});
        let sampling = text(&value).unwrap().request.sampling.unwrap();
        assert_eq!(sampling.temperature, Some(1.0));
    }

    #[test]
    fn bad_fields_are_named() {
        let cases = [
            (
                json!({"messages": [{"role": "user", "content": "x"}], "n": 2}),
                "n",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
                "temperature",
            ),
            (json!({"messages": "x"}), "messages"),
            (json!({"temperature": 0}), "messages"),
            (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
                "messages[0].content[0].type",
            ),
            (json!({"messages": [], "logprobs": true}), "logprobs"),
            (
                json!({"messages": [], "specd": {"blocksize": 3}}),
                "specd.blocksize",
            ),
            (
                json!({"messages": [], "frequency_penalty": 0.5}),
                "frequency_penalty",
            ),
        ];
        for (value, field) in cases {
            let err = chat(&value).unwrap_err();
            assert_eq!(
                err.param.as_deref(),
                Some(field),
                "{value}: {}",
                err.message
            );
        }
        let err = text(&json!({"prompt": ["a", "b"]})).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("prompt"));
        let ids = text(&json!({"prompt": [1, 2, 3]})).unwrap().request.input;
        assert!(matches!(ids, Some(generate_request::Input::PromptIds(t)) if t.ids == [1, 2, 3]));
    }
}
