//! Turning a public GenerateRequest into a checked plan; every rejection names its field.

use std::hash::{BuildHasher, RandomState};

use specd_core::sampling::mix64;
use specd_core::sampling::MAX_TOP_LOGPROBS;
use specd_core::{LogitRules, SamplingParams, TokenConstraint};
use specd_text::{ChatMessage, TemplateVariables, TextError};
use specd_wire::generation::{generate_request, ChatMessages, GenerateRequest};
use tonic::Status;

use crate::config::{RouterConfig, TargetLimits};
use specd_text::TargetText;

/// How a request wants its block size chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockChoice {
    /// No drafting at all.
    Disabled,
    /// This verify width every round (already capped by the router's maximum).
    Fixed(usize),
    /// The router's adaptive policy.
    Adaptive,
}

/// A validated request.
pub struct Plan {
    pub prompt_ids: Vec<u32>,
    /// Ids that end the completion as end of sequence: the target's, and for a chat request
    /// also the chat format's end-of-turn token.
    pub eos_token_ids: Vec<u32>,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    /// `max_tokens` was cut to the room the context leaves, so reaching it is a context
    /// finish.
    pub context_capped: bool,
    pub ignore_eos: bool,
    pub stop: Vec<String>,
    pub block: BlockChoice,
    pub rules: LogitRules,
    pub top_logprobs: Option<u32>,
    /// The compiled output format, when the request has one.
    pub constraint: Option<Box<dyn TokenConstraint>>,
    /// Verify what the constraint forces as free drafts.
    pub fast_forward: bool,
}

/// Checks `request` against the target and the router's configuration.
pub fn plan(
    request: GenerateRequest,
    limits: &TargetLimits,
    config: &RouterConfig,
    text: &TargetText,
) -> Result<Plan, Status> {
    let prompt = prompt_ids(request.input, limits, text)?;
    let (prompt_ids, prompt_field) = (prompt.ids, prompt.field);
    let sampling = sampling(request.sampling.as_ref())?;
    let rules = rules(request.sampling.as_ref(), limits.vocab_size)?;
    if let Some(top) = request.top_logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
        return Err(Status::invalid_argument(format!(
            "top_logprobs: at most {MAX_TOP_LOGPROBS}, got {top}"
        )));
    }
    if let Some(i) = request.stop.iter().position(String::is_empty) {
        return Err(Status::invalid_argument(format!(
            "stop[{i}]: must not be empty"
        )));
    }
    if !request.stop.is_empty() && !text.has_tokenizer() {
        return Err(Status::invalid_argument(
            "stop: stop strings need a tokenizer; this router has none (its target directory \
             has no tokenizer.json)",
        ));
    }
    let context = limits.max_context_tokens;
    if prompt_ids.len() >= context {
        return Err(Status::out_of_range(format!(
            "{prompt_field}: {} tokens leave no room in the context of {context} tokens",
            prompt_ids.len()
        )));
    }
    let room = context - prompt_ids.len();
    let (max_tokens, context_capped) = match request.max_tokens.map(|n| n as usize) {
        None => {
            let default = config.default_max_tokens.min(config.requests.max_tokens) as usize;
            (default.min(room), default > room)
        }
        Some(0) => {
            return Err(Status::invalid_argument(
                "max_tokens: must be at least 1 (leave it unset for the server's default)",
            ))
        }
        Some(asked) if asked > room => {
            return Err(Status::out_of_range(format!(
                "max_tokens: {} prompt tokens plus {asked} new tokens exceed the context of \
                 {context} tokens",
                prompt_ids.len()
            )))
        }
        Some(asked) => (asked, false),
    };
    let block = match request.speculative {
        Some(speculative) if speculative.disabled => BlockChoice::Disabled,
        Some(speculative) => match speculative.block_size {
            Some(0) => {
                return Err(Status::invalid_argument(
                    "speculative.block_size: must be at least 1",
                ))
            }
            Some(1) => BlockChoice::Disabled,
            Some(size) => BlockChoice::Fixed((size as usize).min(config.block_ceiling(limits))),
            None => BlockChoice::Adaptive,
        },
        None => BlockChoice::Adaptive,
    };
    Ok(Plan {
        prompt_ids,
        eos_token_ids: prompt.eos_token_ids,
        sampling,
        max_tokens,
        context_capped,
        ignore_eos: request.ignore_eos,
        stop: request.stop,
        block,
        rules,
        top_logprobs: request.top_logprobs,
        constraint: None,
        fast_forward: request
            .speculative
            .as_ref()
            .and_then(|s| s.fast_forward)
            .unwrap_or(true),
    })
}

/// A request's prompt as token ids, with the field it came from.
struct Prompt {
    ids: Vec<u32>,
    field: &'static str,
    eos_token_ids: Vec<u32>,
}

fn prompt_ids(
    input: Option<generate_request::Input>,
    limits: &TargetLimits,
    text: &TargetText,
) -> Result<Prompt, Status> {
    let mut eos_token_ids = text.eos_token_ids().to_vec();
    let (ids, field) = match input {
        None => {
            return Err(Status::invalid_argument(
                "input: set one of prompt, prompt_ids or messages",
            ))
        }
        Some(generate_request::Input::PromptIds(ids)) => (ids.ids, "prompt_ids"),
        Some(generate_request::Input::Prompt(prompt)) => {
            if prompt.is_empty() {
                return Err(Status::invalid_argument("prompt: must not be empty"));
            }
            if !text.has_tokenizer() {
                return Err(Status::invalid_argument(
                    "prompt: this router has no tokenizer; send prompt_ids instead",
                ));
            }
            let ids = text
                .encode(&prompt)
                .map_err(|e| Status::invalid_argument(format!("prompt: {e}")))?;
            (ids, "prompt")
        }
        Some(generate_request::Input::Messages(chat)) => {
            let variables = template_variables(&chat.template_variables_json)?;
            let messages = chat_messages(chat)?;
            if !text.has_chat_template() {
                return Err(Status::invalid_argument(
                    "messages: this router's target has no tokenizer and chat template; send \
                     prompt or prompt_ids instead",
                ));
            }
            let ids = text
                .encode_chat_with(&messages, &variables)
                .map_err(|e| match e {
                    TextError::TemplateVariable { .. } => {
                        Status::invalid_argument(format!("messages.template_variables_json: {e}"))
                    }
                    _ => Status::invalid_argument(format!("messages: {e}")),
                })?;
            eos_token_ids = text.end_of_turn_ids().to_vec();
            (ids, "messages")
        }
    };
    if ids.is_empty() {
        return Err(Status::invalid_argument(format!(
            "{field}: must not be empty"
        )));
    }
    let vocab = limits.vocab_size;
    if let Some(i) = ids.iter().position(|&t| t as usize >= vocab) {
        return Err(Status::invalid_argument(format!(
            "{field}[{i}]: token id {} is not below the vocabulary size {vocab}",
            ids[i]
        )));
    }
    Ok(Prompt {
        ids,
        field,
        eos_token_ids,
    })
}

/// The conversation, each turn checked: at least one, every role named.
/// The chat template's extra variables: a JSON object, or nothing when empty.
fn template_variables(json: &str) -> Result<TemplateVariables, Status> {
    if json.trim().is_empty() {
        return Ok(TemplateVariables::new());
    }
    serde_json::from_str(json).map_err(|e| {
        Status::invalid_argument(format!(
            "messages.template_variables_json: must be a JSON object: {e}"
        ))
    })
}

fn chat_messages(chat: ChatMessages) -> Result<Vec<ChatMessage>, Status> {
    if chat.messages.is_empty() {
        return Err(Status::invalid_argument(
            "messages: the conversation must have at least one message",
        ));
    }
    chat.messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| {
            if message.role.trim().is_empty() {
                return Err(Status::invalid_argument(format!(
                    "messages[{i}].role: must not be empty"
                )));
            }
            let mut turn = ChatMessage::new(message.role, message.content)
                .with_tool_call_id(message.tool_call_id)
                .with_name(message.name);
            for (j, call) in message.tool_calls.into_iter().enumerate() {
                if call.name.is_empty() {
                    return Err(Status::invalid_argument(format!(
                        "messages[{i}].tool_calls[{j}].name: must not be empty"
                    )));
                }
                turn = turn.with_tool_call(call.id, call.name, &call.arguments_json);
            }
            Ok(turn)
        })
        .collect()
}

/// The request's sampling with the defaults filled in: greedy, no nucleus, no top-k, and a
/// freshly drawn seed when none is given.
fn sampling(
    wire: Option<&specd_wire::generation::SamplingParams>,
) -> Result<SamplingParams, Status> {
    let params = SamplingParams {
        temperature: wire.and_then(|s| s.temperature).unwrap_or(0.0),
        top_p: wire.and_then(|s| s.top_p).unwrap_or(1.0),
        top_k: wire.and_then(|s| s.top_k).unwrap_or(0),
        seed: wire.and_then(|s| s.seed).unwrap_or_else(fresh_seed),
    };
    params.validate().map_err(|error| {
        Status::invalid_argument(format!("sampling.{}: {}", error.field, error.reason))
    })?;
    Ok(params)
}

/// The bias, penalties and min-p of a request, checked against the target's vocabulary;
/// errors name `sampling.<field>`.
fn rules(
    wire: Option<&specd_wire::generation::SamplingParams>,
    vocab_size: usize,
) -> Result<LogitRules, Status> {
    let Some(wire) = wire else {
        return Ok(LogitRules::default());
    };
    let rules = LogitRules {
        presence_penalty: wire.presence_penalty.unwrap_or(0.0),
        frequency_penalty: wire.frequency_penalty.unwrap_or(0.0),
        repetition_penalty: wire.repetition_penalty.unwrap_or(1.0),
        logit_bias: specd_wire::sampling::logit_bias_from_wire(&wire.logit_bias),
        min_p: wire.min_p.unwrap_or(0.0),
    };
    rules.validate(Some(vocab_size)).map_err(|error| {
        Status::invalid_argument(format!("sampling.{}: {}", error.field, error.reason))
    })?;
    Ok(rules)
}

/// A seed nobody chose: the process's random hasher keys mixed with a counter.
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWN: AtomicU64 = AtomicU64::new(0);
    let keyed = RandomState::new().hash_one(DRAWN.fetch_add(1, Ordering::Relaxed));
    mix64(keyed)
}
