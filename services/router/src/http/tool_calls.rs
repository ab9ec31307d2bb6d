//! Tool calls in the model's output: the markup each chat format writes them in, one call's
//! body read into a name and JSON arguments, and the calls as OpenAI reports them.

use std::hash::{BuildHasher, RandomState};

use serde_json::{json, Value};
use specd_text::TargetText;

use super::gemma_args;

/// How the target's chat format writes a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSyntax {
    /// Qwen 2.5 (Hermes): `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.
    Qwen,
    /// Gemma 4: `<|tool_call>call:NAME{key:<|"|>text<|"|>,...}<tool_call|>`.
    Gemma4,
}

impl ToolSyntax {
    /// Gemma 4's when the vocabulary has its call markers, Qwen's otherwise (the format the
    /// fallback chat template asks for).
    pub fn of(text: &TargetText) -> Self {
        let gemma =
            text.token_id("<|tool_call>").is_some() && text.token_id("<tool_call|>").is_some();
        if gemma {
            Self::Gemma4
        } else {
            Self::Qwen
        }
    }

    pub fn open(self) -> &'static str {
        match self {
            Self::Qwen => "<tool_call>",
            Self::Gemma4 => "<|tool_call>",
        }
    }

    pub fn close(self) -> &'static str {
        match self {
            Self::Qwen => "</tool_call>",
            Self::Gemma4 => "<tool_call|>",
        }
    }

    /// The call between the markers; None when it is not one (the text is then left as
    /// the model wrote it).
    pub fn parse(self, body: &str) -> Option<ToolCall> {
        let (name, arguments) = match self {
            Self::Qwen => qwen_call(body)?,
            Self::Gemma4 => gemma_args::parse_call(body)?,
        };
        let arguments = match arguments {
            // A model that writes the arguments as a JSON string already wrote OpenAI's form.
            Value::String(text) if serde_json::from_str::<Value>(&text).is_ok() => text,
            other => other.to_string(),
        };
        Some(ToolCall {
            id: call_id(),
            name,
            arguments,
        })
    }
}

/// `{"name": ..., "arguments": ...}` (`parameters` is taken for `arguments`, as some
/// fine-tunes write it).
fn qwen_call(body: &str) -> Option<(String, Value)> {
    let Value::Object(mut call) = serde_json::from_str::<Value>(body.trim()).ok()? else {
        return None;
    };
    let Some(Value::String(name)) = call.remove("name") else {
        return None;
    };
    let arguments = call
        .remove("arguments")
        .or_else(|| call.remove("parameters"))
        .unwrap_or_else(|| json!({}));
    Some((name, arguments))
}

/// One function call of the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// A JSON text, as OpenAI's `function.arguments`.
    pub arguments: String,
}

impl ToolCall {
    /// The call in a message's `tool_calls`.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }

    /// The call in a stream chunk's `delta.tool_calls`, whole at once: clients append the
    /// argument pieces of one index, and one piece is a valid sequence of pieces.
    pub fn to_delta(&self, index: usize) -> Value {
        let mut delta = self.to_json();
        delta["index"] = json!(index);
        delta
    }
}

/// `call_` and 24 random hex digits, as OpenAI's ids look.
fn call_id() -> String {
    let random = RandomState::new().hash_one(std::time::Instant::now());
    let more = RandomState::new().hash_one(random) >> 32;
    format!("call_{random:016x}{more:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen_bodies_read_as_calls() {
        let call = ToolSyntax::Qwen
            .parse("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n")
            .unwrap();
        assert_eq!(call.name, "get_weather");
        assert_eq!(call.arguments, r#"{"city":"Paris"}"#);
        assert!(
            call.id.starts_with("call_") && call.id.len() == 29,
            "{}",
            call.id
        );
        let stringly = ToolSyntax::Qwen
            .parse(r#"{"name": "f", "arguments": "{\"a\": 1}"}"#)
            .unwrap();
        assert_eq!(stringly.arguments, r#"{"a": 1}"#);
        let bare = ToolSyntax::Qwen.parse(r#"{"name": "f"}"#).unwrap();
        assert_eq!(bare.arguments, "{}");
        let parameters = ToolSyntax::Qwen
            .parse(r#"{"name": "f", "parameters": {"b": [1]}}"#)
            .unwrap();
        assert_eq!(parameters.arguments, r#"{"b":[1]}"#);
        for broken in [
            "",
            "{\"arguments\": {}}",
            "{\"name\": 3}",
            "[1]",
            "{\"name\": \"f\"",
        ] {
            assert_eq!(ToolSyntax::Qwen.parse(broken), None, "{broken}");
        }
    }

    #[test]
    fn gemma_bodies_read_as_calls() {
        let call = ToolSyntax::Gemma4
            .parse(r#"call:get_weather{city:<|"|>Paris<|"|>}"#)
            .unwrap();
        assert_eq!(call.name, "get_weather");
        assert_eq!(call.arguments, r#"{"city":"Paris"}"#);
        assert_eq!(ToolSyntax::Gemma4.parse("get_weather{}"), None);
    }

    #[test]
    fn calls_render_as_openai_writes_them() {
        let call = ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
        };
        assert_eq!(
            call.to_json(),
            json!({"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}})
        );
        assert_eq!(call.to_delta(2)["index"], 2);
        assert_ne!(call_id(), call_id());
    }
}
