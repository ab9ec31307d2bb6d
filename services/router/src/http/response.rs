//! OpenAI response bodies: whole completions, stream chunks, usage, and specd's extension
//! object with the request's speculation stats.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use specd_wire::generation::{FinishReason, GenerationStats};

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
    pub fn whole(&self, text: String, ending: &Ending) -> Value {
        let finish = finish_reason(ending.reason);
        let choice = match self.api {
            Api::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish,
            }),
            Api::Text => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
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

    /// A chunk of new text.
    pub fn text_chunk(&self, text: &str) -> Value {
        self.choice_chunk(text, None)
    }

    /// The chunk that says why the completion ended.
    pub fn finish_chunk(&self, ending: &Ending) -> Value {
        self.choice_chunk("", Some(finish_reason(ending.reason)))
    }

    fn choice_chunk(&self, text: &str, finish: Option<&str>) -> Value {
        let choice = match (self.api, finish) {
            (Api::Chat, None) => json!({
                "index": 0,
                "delta": {"content": text},
                "logprobs": null,
                "finish_reason": null,
            }),
            (Api::Chat, Some(_)) => json!({
                "index": 0,
                "delta": {},
                "logprobs": null,
                "finish_reason": finish,
            }),
            (Api::Text, _) => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
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

/// OpenAI's two reasons: `length` for a token or context limit, `stop` for the rest.
fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length | FinishReason::ContextLength => "length",
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
        "seed": stats.seed,
        "time_to_first_token_ms": stats.time_to_first_token_ms,
        "total_time_ms": stats.total_time_ms,
    })
}
