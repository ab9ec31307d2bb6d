//! OpenAI response bodies: whole completions, stream chunks, usage, and specd's extension
//! object with the request's speculation stats.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use specd_wire::generation::{FinishReason, GenerationStats};

use super::tool_calls::ToolCall;

/// Which API a response answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Text,
}

/// What every body of one response carries.
pub struct Answer {
    api: Api,
    id: String,
    created: u64,
    model: String,
}

/// How a completion ended, from its last message.
pub struct Ending {
    pub reason: FinishReason,
    pub matched_stop: String,
    pub stats: GenerationStats,
}

/// The one choice of a whole answer.
#[derive(Debug, Default)]
pub struct Choice {
    /// The text outside tool calls.
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    /// The API's `logprobs` object; None when the request did not ask.
    pub logprobs: Option<Value>,
}

impl Answer {
    pub fn new(api: Api, id: String, model: String) -> Self {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            api,
            id,
            created,
            model,
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.api, chunk) {
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Text, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// The answer of a request that did not stream.
    pub fn whole(&self, choice: Choice, ending: &Ending) -> Value {
        let called = !choice.tool_calls.is_empty();
        let finish = finish_reason(ending.reason, called);
        let logprobs = choice.logprobs.unwrap_or(Value::Null);
        let choice = match self.api {
            Api::Chat => {
                let mut message = json!({"role": "assistant", "content": choice.text});
                if called {
                    // OpenAI's content is null beside calls when the model wrote nothing else.
                    if choice.text.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] =
                        choice.tool_calls.iter().map(ToolCall::to_json).collect();
                }
                json!({
                    "index": 0,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                })
            }
            Api::Text => json!({
                "index": 0,
                "text": choice.text,
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        };
        let mut body = self.envelope(false, json!([choice]));
        body["usage"] = usage(&ending.stats);
        body["specd"] = specd(ending);
        body
    }

    /// The first chunk of a chat stream: the assistant's role, no text yet.
    pub fn role_chunk(&self) -> Option<Value> {
        (self.api == Api::Chat).then(|| {
            self.envelope(
                true,
                json!([{
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": null,
                    "finish_reason": null,
                }]),
            )
        })
    }

    /// A chunk of new text, with the log probabilities of the tokens that came with it.
    pub fn text_chunk(&self, text: &str, logprobs: Option<Value>) -> Value {
        let delta = match self.api {
            Api::Chat => json!({"content": text}),
            Api::Text => Value::Null,
        };
        self.choice_chunk(delta, text, logprobs, None)
    }

    /// A chunk with one whole tool call (chat only).
    pub fn tool_call_chunk(&self, index: usize, call: &ToolCall, logprobs: Option<Value>) -> Value {
        let delta = json!({"tool_calls": [call.to_delta(index)]});
        self.choice_chunk(delta, "", logprobs, None)
    }

    /// The chunk that says why the completion ended; `called` says whether it called tools.
    pub fn finish_chunk(&self, ending: &Ending, called: bool) -> Value {
        let finish = finish_reason(ending.reason, called);
        self.choice_chunk(json!({}), "", None, Some(finish))
    }

    fn choice_chunk(
        &self,
        delta: Value,
        text: &str,
        logprobs: Option<Value>,
        finish: Option<&str>,
    ) -> Value {
        let logprobs = logprobs.unwrap_or(Value::Null);
        let choice = match self.api {
            Api::Chat => json!({
                "index": 0,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
            Api::Text => json!({
                "index": 0,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        };
        self.envelope(true, json!([choice]))
    }

    /// The stream's usage chunk (`stream_options.include_usage`): no choices.
    pub fn usage_chunk(&self, ending: &Ending) -> Value {
        let mut body = self.envelope(true, json!([]));
        body["usage"] = usage(&ending.stats);
        body["specd"] = specd(ending);
        body
    }
}

/// OpenAI's reasons: `length` for a token or context limit, `tool_calls` when the model
/// called tools and ended its turn, `stop` for the rest.
fn finish_reason(reason: FinishReason, called: bool) -> &'static str {
    match reason {
        FinishReason::Length | FinishReason::ContextLength => "length",
        FinishReason::Eos | FinishReason::Stop | FinishReason::Unspecified if called => {
            "tool_calls"
        }
        FinishReason::Eos | FinishReason::Stop | FinishReason::Unspecified => "stop",
    }
}

fn usage(stats: &GenerationStats) -> Value {
    json!({
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": u64::from(stats.prompt_tokens) + u64::from(stats.completion_tokens),
        "prompt_tokens_details": {"cached_tokens": stats.cached_prompt_tokens},
    })
}

/// specd's extension object: why exactly the completion ended and how speculation went.
fn specd(ending: &Ending) -> Value {
    let stats = &ending.stats;
    let reason = match ending.reason {
        FinishReason::Length => "length",
        FinishReason::ContextLength => "context_length",
        FinishReason::Eos => "eos",
        FinishReason::Stop => "stop",
        FinishReason::Unspecified => "unspecified",
    };
    json!({
        "finish_reason": reason,
        "matched_stop": (!ending.matched_stop.is_empty()).then_some(&ending.matched_stop),
        "rounds": stats.rounds,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "accepted_per_position": stats.accepted_per_position,
        "mean_accepted_tokens_per_round": stats.mean_accepted_tokens_per_round,
        "plain_rounds": stats.plain_rounds,
        "drafter_resyncs": stats.drafter_resyncs,
        "verifier_migrations": stats.verifier_migrations,
        "predraft_hits": stats.predraft_hits,
        "predraft_misses": stats.predraft_misses,
        "predraft_branch_hits": stats.predraft_branch_hits,
        "overlap_switches": stats.overlap_switches,
        "forced_drafted": stats.forced_drafted,
        "forced_accepted": stats.forced_accepted,
        "tree_rounds": stats.tree_rounds,
        "tree_branch_drafts": stats.tree_branch_drafts,
        "seed": stats.seed,
        "time_to_first_token_ms": stats.time_to_first_token_ms,
        "total_time_ms": stats.total_time_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ending(reason: FinishReason) -> Ending {
        Ending {
            reason,
            matched_stop: String::new(),
            stats: GenerationStats {
                prompt_tokens: 3,
                completion_tokens: 4,
                forced_drafted: 6,
                forced_accepted: 5,
                ..GenerationStats::default()
            },
        }
    }

    fn call() -> ToolCall {
        ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{\"a\":1}".into(),
        }
    }

    #[test]
    fn whole_chat_answers_carry_calls_logprobs_and_forced_stats() {
        let answer = Answer::new(Api::Chat, "id".into(), "m".into());
        let body = answer.whole(
            Choice {
                text: String::new(),
                tool_calls: vec![call()],
                logprobs: Some(json!({"content": []})),
            },
            &ending(FinishReason::Eos),
        );
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["content"], Value::Null);
        assert_eq!(choice["message"]["tool_calls"], json!([call().to_json()]));
        assert_eq!(choice["logprobs"], json!({"content": []}));
        assert_eq!(body["specd"]["forced_drafted"], 6);
        assert_eq!(body["specd"]["forced_accepted"], 5);
        let plain = answer.whole(
            Choice {
                text: "hi".into(),
                ..Choice::default()
            },
            &ending(FinishReason::Stop),
        );
        let choice = &plain["choices"][0];
        assert_eq!(
            choice["message"],
            json!({"role": "assistant", "content": "hi"})
        );
        assert_eq!(
            (&choice["logprobs"], &choice["finish_reason"]),
            (&Value::Null, &json!("stop"))
        );
        // A call cut off by the token limit ends for the limit.
        let cut = answer.whole(
            Choice {
                text: "x".into(),
                tool_calls: vec![call()],
                logprobs: None,
            },
            &ending(FinishReason::Length),
        );
        assert_eq!(cut["choices"][0]["finish_reason"], "length");
        assert_eq!(cut["choices"][0]["message"]["content"], "x");
    }

    #[test]
    fn chunks_carry_text_calls_and_logprobs() {
        let chat = Answer::new(Api::Chat, "id".into(), "m".into());
        let text = chat.text_chunk("Hi", Some(json!({"content": [1]})));
        assert_eq!(text["choices"][0]["delta"], json!({"content": "Hi"}));
        assert_eq!(text["choices"][0]["logprobs"], json!({"content": [1]}));
        let called = chat.tool_call_chunk(1, &call(), None);
        assert_eq!(
            called["choices"][0]["delta"],
            json!({"tool_calls": [{"index": 1, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]})
        );
        assert_eq!(called["object"], "chat.completion.chunk");
        let finish = chat.finish_chunk(&ending(FinishReason::Eos), true);
        assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(finish["choices"][0]["delta"], json!({}));
        let legacy = Answer::new(Api::Text, "id".into(), "m".into());
        let text = legacy.text_chunk("Hi", Some(json!({"tokens": ["Hi"]})));
        assert_eq!(text["choices"][0]["text"], "Hi");
        assert_eq!(text["choices"][0]["logprobs"]["tokens"], json!(["Hi"]));
        let finish = legacy.finish_chunk(&ending(FinishReason::Length), false);
        assert_eq!(finish["choices"][0]["finish_reason"], "length");
        assert_eq!(finish["choices"][0]["text"], "");
    }
}
