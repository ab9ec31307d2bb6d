//! Bounds on what one request may ask of the router, each checked before any work is done
//! for it and refused with an error naming the field and the limit.

use std::time::Duration;

use specd_wire::generation::{generate_request, GenerateRequest};
use tonic::Status;

/// What one request may ask.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    /// Bytes of prompt text or chat messages, checked before tokenization.
    pub max_prompt_bytes: usize,
    /// Largest `max_tokens` a request may ask for (and the ceiling of the default).
    pub max_tokens: u32,
    /// Stop strings per request.
    pub max_stop_strings: usize,
    /// Bytes of one stop string.
    pub max_stop_string_bytes: usize,
    /// How long one request may run; `None`: as long as it needs.
    pub max_duration: Option<Duration>,
    /// A streaming client that has read nothing for this long is dropped and its request's
    /// place, sequence and session are freed; `None`: wait for it forever.
    pub stream_stall_timeout: Option<Duration>,
    /// Prompts tokenized at once, off the async runtime; more wait for a turn.
    pub tokenizer_threads: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_prompt_bytes: 1 << 20,
            max_tokens: 32_768,
            max_stop_strings: 16,
            max_stop_string_bytes: 256,
            max_duration: Some(Duration::from_secs(1800)),
            stream_stall_timeout: Some(Duration::from_secs(60)),
            tokenizer_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        }
    }
}

impl RequestLimits {
    /// The checks that need nothing but the request: prompt size, stop strings, max_tokens.
    pub fn check(&self, request: &GenerateRequest) -> Result<(), Status> {
        let (field, bytes) = match &request.input {
            Some(generate_request::Input::Prompt(prompt)) => ("prompt", prompt.len()),
            Some(generate_request::Input::Messages(chat)) => (
                "messages",
                chat.messages
                    .iter()
                    .map(|m| {
                        m.role.len()
                            + m.content.len()
                            + m.tool_call_id.len()
                            + m.name.len()
                            + m.tool_calls
                                .iter()
                                .map(|c| c.id.len() + c.name.len() + c.arguments_json.len())
                                .sum::<usize>()
                    })
                    .sum::<usize>()
                    + chat.template_variables_json.len(),
            ),
            Some(generate_request::Input::PromptIds(ids)) => ("prompt_ids", ids.ids.len() * 4),
            None => ("input", 0),
        };
        if bytes > self.max_prompt_bytes {
            return Err(Status::invalid_argument(format!(
                "{field}: {bytes} bytes exceed this server's limit of {} bytes \
                 (--max-prompt-bytes)",
                self.max_prompt_bytes
            )));
        }
        if request.stop.len() > self.max_stop_strings {
            return Err(Status::invalid_argument(format!(
                "stop: {} stop strings exceed this server's limit of {} (--max-stop-strings)",
                request.stop.len(),
                self.max_stop_strings
            )));
        }
        if let Some(i) = request
            .stop
            .iter()
            .position(|s| s.len() > self.max_stop_string_bytes)
        {
            return Err(Status::invalid_argument(format!(
                "stop[{i}]: {} bytes exceed this server's limit of {} bytes \
                 (--max-stop-string-bytes)",
                request.stop[i].len(),
                self.max_stop_string_bytes
            )));
        }
        if let Some(asked) = request.max_tokens.filter(|&n| n > self.max_tokens) {
            return Err(Status::out_of_range(format!(
                "max_tokens: {asked} exceeds this server's limit of {} (--max-tokens-limit)",
                self.max_tokens
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use specd_wire::generation::{chat_message, ChatMessage, ChatMessages};

    use super::*;

    fn prompt(text: &str) -> GenerateRequest {
        GenerateRequest {
            input: Some(generate_request::Input::Prompt(text.into())),
            ..GenerateRequest::default()
        }
    }

    #[test]
    fn each_limit_names_its_field_and_flag() {
        let limits = RequestLimits {
            max_prompt_bytes: 8,
            max_tokens: 10,
            max_stop_strings: 2,
            max_stop_string_bytes: 3,
            ..RequestLimits::default()
        };
        assert!(limits.check(&prompt("12345678")).is_ok());
        let cases = [
            (
                prompt("123456789"),
                "prompt:",
                "--max-prompt-bytes",
                tonic::Code::InvalidArgument,
            ),
            (
                GenerateRequest {
                    input: Some(generate_request::Input::Messages(ChatMessages {
                        messages: vec![ChatMessage {
                            role: "user".into(),
                            content: "hello".into(),
                            ..Default::default()
                        }],
                        template_variables_json: String::new(),
                    })),
                    ..GenerateRequest::default()
                },
                "messages:",
                "--max-prompt-bytes",
                tonic::Code::InvalidArgument,
            ),
            (
                GenerateRequest {
                    input: Some(generate_request::Input::Messages(ChatMessages {
                        messages: vec![ChatMessage {
                            role: "tool".into(),
                            tool_calls: vec![chat_message::ToolCall {
                                id: "c".into(),
                                name: "f".into(),
                                arguments_json: "{\"x\":1}".into(),
                            }],
                            ..Default::default()
                        }],
                        template_variables_json: String::new(),
                    })),
                    ..GenerateRequest::default()
                },
                "messages:",
                "--max-prompt-bytes",
                tonic::Code::InvalidArgument,
            ),
            (
                GenerateRequest {
                    stop: vec!["a".into(), "b".into(), "c".into()],
                    ..prompt("x")
                },
                "stop:",
                "--max-stop-strings",
                tonic::Code::InvalidArgument,
            ),
            (
                GenerateRequest {
                    stop: vec!["a".into(), "abcd".into()],
                    ..prompt("x")
                },
                "stop[1]:",
                "--max-stop-string-bytes",
                tonic::Code::InvalidArgument,
            ),
            (
                GenerateRequest {
                    max_tokens: Some(11),
                    ..prompt("x")
                },
                "max_tokens:",
                "--max-tokens-limit",
                tonic::Code::OutOfRange,
            ),
        ];
        for (request, field, flag, code) in cases {
            let err = limits.check(&request).unwrap_err();
            assert_eq!(err.code(), code, "{err}");
            assert!(err.message().starts_with(field), "{err}");
            assert!(err.message().contains(flag), "{err}");
        }
    }
}
