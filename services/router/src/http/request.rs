//! OpenAI request bodies, checked and turned into the public gRPC request, so HTTP and gRPC
//! share one validation, one round loop and one set of limits.

use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use specd_wire::generation::output_constraint::Kind;
use specd_wire::generation::{
    chat_message, generate_request, ChatMessage, ChatMessages, GenerateRequest, SamplingParams,
    SpeculativeParams, TokenIds,
};

use super::constraint::{self, Constraints};
use super::error::ApiError;
use super::tool_calls::ToolSyntax;
use super::tools::{self, ToolOutput};

/// The OpenAI default temperature: a request that leaves it out samples at 1.
const DEFAULT_TEMPERATURE: f32 = 1.0;

/// The most alternatives per token a request may ask for (OpenAI's chat limit; the legacy
/// completions' is 5, taken up to this too).
const MAX_TOP_LOGPROBS: u32 = 20;

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
    /// vLLM's (Hugging Face's): penalises tokens of prompt and output alike; 1 is off.
    pub repetition_penalty: Option<f32>,
    /// vLLM's: drop tokens below this fraction of the likeliest one's probability.
    pub min_p: Option<f32>,
    /// Token id (as a string: JSON keys are) to the bias added to its logit.
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// OpenAI documents it for chat; vLLM takes it for completions too.
    pub response_format: Option<Value>,
    /// vLLM's constraint fields.
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_grammar: Option<String>,
    pub guided_choice: Option<Vec<String>>,
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
    /// The whole output matches this regular expression.
    pub regex: Option<String>,
    /// The output is in this Lark grammar's language (llguidance's dialect).
    pub lark: Option<String>,
    /// `false` stops verifying the tokens an output constraint forces as free drafts.
    pub fast_forward: Option<bool>,
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
    top_logprobs: Option<u32>,
    /// Checked by [`tools::tool_use`], which names the field at fault.
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct InMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    tool_calls: Option<Vec<InToolCall>>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

/// A call of an earlier assistant turn.
#[derive(Debug, Deserialize)]
struct InToolCall {
    #[serde(default)]
    id: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    function: InFunctionCall,
}

#[derive(Debug, Deserialize)]
struct InFunctionCall {
    name: String,
    /// A JSON text (OpenAI's form), or the object itself (some clients').
    #[serde(default)]
    arguments: Option<Value>,
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
    /// The field the output constraint came from, for the router's errors about it.
    pub constraint_field: Option<&'static str>,
    /// How to read tool calls out of the output; None when the model may not call any.
    pub tools: Option<ToolOutput>,
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

/// `POST /v1/chat/completions`; `syntax` is how the target writes tool calls.
pub fn chat(value: &Value, syntax: ToolSyntax) -> Result<Completion, ApiError> {
    let common: CommonParams = typed(value)?;
    let body: ChatBody = typed(value)?;
    let top_logprobs = match (body.logprobs, body.top_logprobs) {
        (Some(true), top) => Some(top_logprobs("top_logprobs", top.unwrap_or(0))?),
        (_, Some(_)) => return Err(ApiError::field("top_logprobs", "needs \"logprobs\": true")),
        (_, None) => None,
    };
    let tool_use = tools::tool_use(
        body.tools.as_deref(),
        body.tool_choice.as_ref(),
        body.parallel_tool_calls,
        syntax,
    )?;
    let messages = chat_messages(body.messages)?;
    let mut variables = body.chat_template_kwargs.unwrap_or_default();
    let mut forced = None;
    let mut tool_output = None;
    if let Some(tool_use) = tool_use {
        if let Some(tools) = tool_use.template_tools {
            if variables.contains_key("tools") {
                return Err(ApiError::field(
                    "chat_template_kwargs.tools",
                    "the request's tools field sets the template's tools",
                ));
            }
            variables.insert("tools".into(), tools);
        }
        forced = tool_use.grammar;
        tool_output = tool_use.output;
    }
    let template_variables_json = if variables.is_empty() {
        String::new()
    } else {
        Value::Object(variables).to_string()
    };
    let input = generate_request::Input::Messages(ChatMessages {
        messages,
        template_variables_json,
    });
    let mut completion = completion(common, input, top_logprobs, forced)?;
    completion.tools = tool_output;
    Ok(completion)
}

/// The conversation as the chat template gets it: text content, earlier calls with
/// their arguments checked as JSON, and each `tool` turn's function name (from the call it
/// answers when the client leaves it out; Gemma 4's template writes it).
fn chat_messages(messages: Vec<InMessage>) -> Result<Vec<ChatMessage>, ApiError> {
    let mut call_names: HashMap<String, String> = HashMap::new();
    messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| {
            let tool_calls = message
                .tool_calls
                .unwrap_or_default()
                .into_iter()
                .enumerate()
                .map(|(j, call)| tool_call(i, j, call))
                .collect::<Result<Vec<_>, _>>()?;
            for call in &tool_calls {
                call_names.insert(call.id.clone(), call.name.clone());
            }
            let tool_call_id = message.tool_call_id.unwrap_or_default();
            let name = message
                .name
                .or_else(|| {
                    (message.role == "tool")
                        .then(|| call_names.get(&tool_call_id).cloned())
                        .flatten()
                })
                .unwrap_or_default();
            Ok(ChatMessage {
                role: message.role,
                content: content_text(i, message.content)?,
                tool_calls,
                tool_call_id,
                name,
            })
        })
        .collect()
}

fn tool_call(
    message: usize,
    index: usize,
    call: InToolCall,
) -> Result<chat_message::ToolCall, ApiError> {
    let field = |name: &str| format!("messages[{message}].tool_calls[{index}]{name}");
    if call.kind.as_deref().is_some_and(|kind| kind != "function") {
        return Err(ApiError::field(
            field(".type"),
            "only \"function\" calls are supported",
        ));
    }
    let arguments_json = match call.function.arguments {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(text)) => match serde_json::from_str::<Value>(&text) {
            Ok(_) => text,
            Err(e) => {
                return Err(ApiError::field(
                    field(".function.arguments"),
                    format!("not JSON: {e}"),
                ))
            }
        },
        Some(object @ Value::Object(_)) => object.to_string(),
        Some(_) => {
            return Err(ApiError::field(
                field(".function.arguments"),
                "must be a JSON object or a string holding one",
            ))
        }
    };
    Ok(chat_message::ToolCall {
        id: call.id.unwrap_or_default(),
        name: call.function.name,
        arguments_json,
    })
}

/// `top_logprobs` (chat) or `logprobs` (completions), within what the router reports.
fn top_logprobs(field: &'static str, n: u32) -> Result<u32, ApiError> {
    if n > MAX_TOP_LOGPROBS {
        return Err(ApiError::field(
            field,
            format!("at most {MAX_TOP_LOGPROBS} alternatives per token, not {n}"),
        ));
    }
    Ok(n)
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
    let top_logprobs = body
        .logprobs
        .map(|n| top_logprobs("logprobs", n))
        .transpose()?;
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
    completion(common, input, top_logprobs, None)
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

/// The request both APIs make; `forced_call` is the grammar of a forced tool call.
fn completion(
    common: CommonParams,
    input: generate_request::Input,
    top_logprobs: Option<u32>,
    forced_call: Option<String>,
) -> Result<Completion, ApiError> {
    if common.n.is_some_and(|n| n != 1) {
        return Err(ApiError::field(
            "n",
            "only 1 completion per request is supported",
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
    let logit_bias = logit_bias(common.logit_bias.as_ref())?;
    let specd = common.specd.unwrap_or_default();
    let mut constraints = Constraints::default();
    if let Some(grammar) = forced_call {
        constraints.add("tool_choice", Kind::Lark(grammar))?;
    }
    if let Some(format) = &common.response_format {
        if let Some(kind) = constraint::response_format(format)? {
            constraints.add("response_format", kind)?;
        }
    }
    if let Some(schema) = &common.guided_json {
        constraints.add("guided_json", constraint::guided_json(schema)?)?;
    }
    if let Some(regex) = common.guided_regex {
        constraints.add("guided_regex", Kind::Regex(regex))?;
    }
    if let Some(grammar) = common.guided_grammar {
        constraints.add("guided_grammar", Kind::Lark(grammar))?;
    }
    if let Some(choices) = &common.guided_choice {
        constraints.add("guided_choice", constraint::guided_choice(choices)?)?;
    }
    if let Some(regex) = specd.regex {
        constraints.add("specd.regex", Kind::Regex(regex))?;
    }
    if let Some(grammar) = specd.lark {
        constraints.add("specd.lark", Kind::Lark(grammar))?;
    }
    let chosen = constraints.into_chosen();
    let speculative = SpeculativeParams {
        block_size: specd.block_size,
        disabled: specd.speculative == Some(false),
        fast_forward: specd.fast_forward,
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
            presence_penalty: common.presence_penalty,
            frequency_penalty: common.frequency_penalty,
            repetition_penalty: common.repetition_penalty,
            min_p: common.min_p,
            logit_bias,
        }),
        speculative: Some(speculative),
        cache_salt: common.cache_salt.unwrap_or_default(),
        top_logprobs,
        constraint: chosen.as_ref().map(|chosen| chosen.constraint.clone()),
    };
    Ok(Completion {
        request,
        model: common.model,
        stream: common.stream.unwrap_or(false),
        include_usage: common
            .stream_options
            .and_then(|options| options.include_usage)
            .unwrap_or(false),
        constraint_field: chosen.map(|chosen| chosen.field),
        tools: None,
    })
}

/// OpenAI's `logit_bias`: token ids written as JSON keys, each to a number. The router
/// checks the ranges (ids below the vocabulary, biases within ±100).
fn logit_bias(
    bias: Option<&serde_json::Map<String, Value>>,
) -> Result<HashMap<u32, f32>, ApiError> {
    let Some(bias) = bias else {
        return Ok(HashMap::new());
    };
    bias.iter()
        .map(|(key, value)| {
            let id = key.trim().parse::<u32>().map_err(|_| {
                ApiError::field(
                    "logit_bias",
                    format!("keys are token ids, and {key:?} is not one"),
                )
            })?;
            let bias = value.as_f64().ok_or_else(|| {
                ApiError::field(
                    "logit_bias",
                    format!("the bias of token {key} must be a number, not {value}"),
                )
            })?;
            // A bias beyond f32 is out of the router's range either way; it names it.
            Ok((id, bias as f32))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use specd_wire::generation::OutputConstraint;

    use super::*;

    fn chat(value: &Value) -> Result<Completion, ApiError> {
        super::chat(value, ToolSyntax::Qwen)
    }

    fn messages_of(request: &GenerateRequest) -> &ChatMessages {
        match &request.input {
            Some(generate_request::Input::Messages(chat)) => chat,
            other => panic!("not a chat request: {other:?}"),
        }
    }

    fn variables_of(request: &GenerateRequest) -> Value {
        let json = &messages_of(request).template_variables_json;
        if json.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(json).unwrap()
        }
    }

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
            "specd": {"block_size": 3, "fast_forward": false},
        });
        let chat = chat(&value).unwrap();
        assert!(chat.stream && chat.include_usage);
        assert_eq!(chat.model.as_deref(), Some("m"));
        assert_eq!((chat.constraint_field, chat.tools), (None, None));
        let request = chat.request;
        assert_eq!(request.max_tokens, Some(7));
        assert_eq!(request.stop, ["END"]);
        assert_eq!((request.top_logprobs, request.constraint), (None, None));
        let sampling = request.sampling.unwrap();
        assert_eq!((sampling.temperature, sampling.seed), (Some(0.0), Some(5)));
        let speculative = request.speculative.unwrap();
        assert_eq!(speculative.block_size, Some(3));
        assert_eq!(speculative.fast_forward, Some(false));
        let Some(generate_request::Input::Messages(chat)) = request.input else {
            panic!("not a chat request");
        };
        assert_eq!(chat.messages[1].content, "Hi!");
        assert_eq!(chat.template_variables_json, "");
    }

    #[test]
    fn unset_temperature_is_openais_default() {
        let value = json!({"prompt": "x"});
        let sampling = text(&value).unwrap().request.sampling.unwrap();
        assert_eq!(sampling.temperature, Some(1.0));
    }

    #[test]
    fn penalties_bias_and_min_p_reach_the_sampling_params() {
        let value = json!({
            "prompt": "x",
            "presence_penalty": 0.5,
            "frequency_penalty": -1,
            "repetition_penalty": 1.1,
            "min_p": 0.05,
            "logit_bias": {"50256": -100, " 7": 2.5},
        });
        let sampling = text(&value).unwrap().request.sampling.unwrap();
        assert_eq!(sampling.presence_penalty, Some(0.5));
        assert_eq!(sampling.frequency_penalty, Some(-1.0));
        assert_eq!(sampling.repetition_penalty, Some(1.1));
        assert_eq!(sampling.min_p, Some(0.05));
        assert_eq!(
            sampling.logit_bias,
            HashMap::from([(50256, -100.0), (7, 2.5)])
        );
        let plain = text(&json!({"prompt": "x"}))
            .unwrap()
            .request
            .sampling
            .unwrap();
        assert_eq!(
            (plain.presence_penalty, plain.min_p, plain.logit_bias.len()),
            (None, None, 0)
        );
    }

    #[test]
    fn logprobs_ask_for_alternatives() {
        let messages = json!([{"role": "user", "content": "x"}]);
        let asked = |extra: Value| {
            let mut value = json!({"messages": messages});
            value
                .as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            chat(&value).map(|c| c.request.top_logprobs)
        };
        assert_eq!(asked(json!({})).unwrap(), None);
        assert_eq!(asked(json!({"logprobs": false})).unwrap(), None);
        assert_eq!(asked(json!({"logprobs": true})).unwrap(), Some(0));
        assert_eq!(
            asked(json!({"logprobs": true, "top_logprobs": 20})).unwrap(),
            Some(20)
        );
        for bad in [
            json!({"logprobs": true, "top_logprobs": 21}),
            json!({"top_logprobs": 2}),
            json!({"logprobs": false, "top_logprobs": 2}),
            json!({"logprobs": true, "top_logprobs": -1}),
        ] {
            let err = asked(bad.clone()).unwrap_err();
            assert_eq!(err.param.as_deref(), Some("top_logprobs"), "{bad}");
        }
        let legacy = |n: Value| text(&json!({"prompt": "x", "logprobs": n}));
        assert_eq!(legacy(json!(5)).unwrap().request.top_logprobs, Some(5));
        assert_eq!(legacy(json!(0)).unwrap().request.top_logprobs, Some(0));
        assert_eq!(legacy(Value::Null).unwrap().request.top_logprobs, None);
        let err = legacy(json!(21)).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("logprobs"));
    }

    #[test]
    fn constraints_come_from_any_one_field() {
        let constrained = |extra: Value| {
            let mut value = json!({"prompt": "x"});
            value
                .as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            text(&value).map(|c| (c.request.constraint, c.constraint_field))
        };
        let kind = |kind: Kind| Some(OutputConstraint { kind: Some(kind) });
        assert_eq!(
            constrained(json!({"response_format": {"type": "json_object"}})).unwrap(),
            (kind(Kind::JsonObject(true)), Some("response_format"))
        );
        assert_eq!(
            constrained(json!({"response_format": {"type": "text"}})).unwrap(),
            (None, None)
        );
        assert_eq!(
            constrained(json!({"specd": {"regex": "[0-9]+"}})).unwrap(),
            (kind(Kind::Regex("[0-9]+".into())), Some("specd.regex"))
        );
        assert_eq!(
            constrained(json!({"specd": {"lark": "start: \"a\""}})).unwrap(),
            (kind(Kind::Lark("start: \"a\"".into())), Some("specd.lark"))
        );
        assert_eq!(
            constrained(json!({"guided_regex": "a|b"})).unwrap(),
            (kind(Kind::Regex("a|b".into())), Some("guided_regex"))
        );
        assert_eq!(
            constrained(json!({"guided_grammar": "start: \"a\""})).unwrap(),
            (
                kind(Kind::Lark("start: \"a\"".into())),
                Some("guided_grammar")
            )
        );
        assert_eq!(
            constrained(json!({"guided_json": {"type": "integer"}})).unwrap(),
            (
                kind(Kind::JsonSchema("{\"type\":\"integer\"}".into())),
                Some("guided_json")
            )
        );
        assert_eq!(
            constrained(json!({"guided_choice": ["yes", "no"]})).unwrap(),
            (kind(Kind::Regex("(yes|no)".into())), Some("guided_choice"))
        );
        let two = constrained(json!({
            "response_format": {"type": "json_object"},
            "specd": {"lark": "start: \"a\""},
        }))
        .unwrap_err();
        assert_eq!(two.param.as_deref(), Some("specd.lark"));
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        let chat = chat(&json!({
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        }))
        .unwrap();
        let Some(OutputConstraint {
            kind: Some(Kind::JsonSchema(text)),
        }) = chat.request.constraint
        else {
            panic!("no schema");
        };
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), schema);
    }

    #[test]
    fn tools_reach_the_template_and_calls_the_conversation() {
        let tool = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}});
        let value = json!({
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                {"role": "tool", "tool_call_id": "call_2", "name": "weather", "content": [{"type": "text", "text": "rain"}]},
                {"role": "tool", "tool_call_id": "call_9"},
            ],
            "tools": [tool],
            "chat_template_kwargs": {"enable_thinking": false},
            "parallel_tool_calls": false,
        });
        let chat = chat(&value).unwrap();
        assert_eq!(
            chat.tools,
            Some(ToolOutput {
                syntax: ToolSyntax::Qwen,
                parallel: false
            })
        );
        assert_eq!(chat.request.constraint, None);
        assert_eq!(
            variables_of(&chat.request),
            json!({"enable_thinking": false, "tools": [tool]})
        );
        let messages = &messages_of(&chat.request).messages;
        assert_eq!(messages[1].content, "");
        assert_eq!(
            messages[1].tool_calls,
            [
                chat_message::ToolCall {
                    id: "call_1".into(),
                    name: "get_weather".into(),
                    arguments_json: "{\"city\": \"Paris\"}".into(),
                },
                chat_message::ToolCall {
                    id: "call_2".into(),
                    name: "get_weather".into(),
                    arguments_json: "{\"city\":\"Rome\"}".into(),
                },
            ]
        );
        let tool_turn = |i: usize| {
            let m = &messages[i];
            (m.tool_call_id.as_str(), m.name.as_str(), m.content.as_str())
        };
        assert_eq!(tool_turn(2), ("call_1", "get_weather", "sunny"));
        assert_eq!(tool_turn(3), ("call_2", "weather", "rain"));
        assert_eq!(tool_turn(4), ("call_9", "", ""));
    }

    #[test]
    fn forced_calls_are_a_grammar_and_none_hides_the_tools() {
        let tool = json!({"type": "function", "function": {"name": "f"}});
        let base = |choice: Value| {
            json!({
                "messages": [{"role": "user", "content": "x"}],
                "tools": [tool],
                "tool_choice": choice,
            })
        };
        let required = chat(&base(json!("required"))).unwrap();
        assert_eq!(required.constraint_field, Some("tool_choice"));
        assert!(matches!(
            required.request.constraint,
            Some(OutputConstraint { kind: Some(Kind::Lark(ref grammar)) }) if grammar.contains("\"f\"")
        ));
        let none = chat(&base(json!("none"))).unwrap();
        assert_eq!(variables_of(&none.request), Value::Null);
        assert_eq!((none.tools, none.request.constraint), (None, None));
        let mut both = base(json!("required"));
        both["response_format"] = json!({"type": "json_object"});
        let err = chat(&both).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("response_format"));
        let mut shadowed = base(json!("auto"));
        shadowed["chat_template_kwargs"] = json!({"tools": []});
        let err = chat(&shadowed).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("chat_template_kwargs.tools"));
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
            (
                json!({"messages": [], "specd": {"blocksize": 3}}),
                "specd.blocksize",
            ),
            (
                json!({"messages": [], "logit_bias": {"x": 1}}),
                "logit_bias",
            ),
            (
                json!({"messages": [], "logit_bias": {"-1": 1}}),
                "logit_bias",
            ),
            (
                json!({"messages": [], "logit_bias": {"5": "up"}}),
                "logit_bias",
            ),
            (
                json!({"messages": [], "response_format": {"type": "xml"}}),
                "response_format.type",
            ),
            (
                json!({"messages": [], "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"messages": [], "tools": [{"type": "function", "function": {}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"messages": [], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
                "tool_choice",
            ),
            (
                json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]}),
                "messages[0].tool_calls[0].function.arguments",
            ),
            (
                json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]}),
                "messages[0].tool_calls[0].function.arguments",
            ),
            (
                json!({"messages": [{"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}]}),
                "messages[0].tool_calls[0].type",
            ),
            (
                json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}),
                "messages[0].tool_calls[0].function.name",
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
