//! What a request's stream messages become: stream chunks as they arrive (text, tool
//! calls, log probabilities of the message's tokens), or one whole choice at the end.

use serde_json::Value;
use specd_wire::generation::{GenerateStreamResponse, TokenLogprob};

use super::logprobs::{self, TextLogprobs, TokenBytes};
use super::request::Completion;
use super::response::{Answer, Api, Choice, Ending};
use super::tool_stream::{split_whole, Piece, ToolStream};
use super::tools::ToolOutput;

/// How a request's output is answered.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub api: Api,
    /// Whether the request asked for log probabilities.
    pub logprobs: bool,
    pub tools: Option<ToolOutput>,
}

impl Shape {
    pub fn of(api: Api, completion: &Completion) -> Self {
        Self {
            api,
            logprobs: completion.request.top_logprobs.is_some(),
            tools: completion.tools,
        }
    }
}

/// Turns a stream's messages into chunks, in order.
pub struct Relay {
    shape: Shape,
    tools: Option<ToolStream>,
    text_logprobs: TextLogprobs,
}

impl Relay {
    pub fn new(shape: Shape) -> Self {
        Self {
            shape,
            tools: shape
                .tools
                .map(|tools| ToolStream::new(tools.syntax, tools.parallel)),
            text_logprobs: TextLogprobs::default(),
        }
    }

    /// The chunks of one message (before its ending, if it has one). The message's log
    /// probabilities ride on its first chunk, or on a chunk of their own when its text is
    /// held back (a partial character, a tool call being read).
    pub fn chunks(
        &mut self,
        answer: &Answer,
        message: &GenerateStreamResponse,
        text: &impl TokenBytes,
    ) -> Vec<Value> {
        let mut logprobs = (self.shape.logprobs && !message.logprobs.is_empty())
            .then(|| self.logprobs(&message.logprobs, text));
        let pieces = match &mut self.tools {
            Some(tools) => tools.push(&message.text),
            None if message.text.is_empty() => Vec::new(),
            None => vec![Piece::Text(message.text.clone())],
        };
        let mut chunks: Vec<Value> = pieces
            .into_iter()
            .map(|piece| match piece {
                Piece::Text(text) => answer.text_chunk(&text, logprobs.take()),
                Piece::Call(index, call) => answer.tool_call_chunk(index, &call, logprobs.take()),
            })
            .collect();
        if let Some(logprobs) = logprobs {
            chunks.push(answer.text_chunk("", Some(logprobs)));
        }
        chunks
    }

    /// The last chunks: what tool-call reading held back, then the finish.
    pub fn finish(&mut self, answer: &Answer, ending: &Ending) -> Vec<Value> {
        let Some(tools) = &mut self.tools else {
            return vec![answer.finish_chunk(ending, false)];
        };
        let mut chunks: Vec<Value> = tools
            .finish()
            .into_iter()
            .map(|piece| match piece {
                Piece::Text(text) => answer.text_chunk(&text, None),
                Piece::Call(index, call) => answer.tool_call_chunk(index, &call, None),
            })
            .collect();
        chunks.push(answer.finish_chunk(ending, tools.calls() > 0));
        chunks
    }

    fn logprobs(&mut self, logprobs: &[TokenLogprob], text: &impl TokenBytes) -> Value {
        match self.shape.api {
            Api::Chat => logprobs::chat(logprobs, text),
            Api::Text => self.text_logprobs.render(logprobs, text),
        }
    }
}

/// A whole answer's choice from all of its text and log probabilities.
pub fn whole_choice(
    shape: Shape,
    text: String,
    logprobs: &[TokenLogprob],
    vocab: &impl TokenBytes,
) -> Choice {
    let logprobs = shape.logprobs.then(|| match shape.api {
        Api::Chat => logprobs::chat(logprobs, vocab),
        Api::Text => TextLogprobs::default().render(logprobs, vocab),
    });
    match shape.tools {
        Some(tools) => {
            let (text, tool_calls) = split_whole(tools.syntax, tools.parallel, &text);
            Choice {
                text,
                tool_calls,
                logprobs,
            }
        }
        None => Choice {
            text,
            tool_calls: Vec::new(),
            logprobs,
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use specd_wire::generation::{FinishReason, GenerationStats};

    use super::super::logprobs::tests::{logprob, Vocab};
    use super::super::tool_calls::ToolSyntax;
    use super::*;

    fn message(text: &str, logprobs: Vec<TokenLogprob>) -> GenerateStreamResponse {
        GenerateStreamResponse {
            token_ids: logprobs.iter().map(|l| l.token).collect(),
            text: text.into(),
            logprobs,
            ..GenerateStreamResponse::default()
        }
    }

    fn ending() -> Ending {
        Ending {
            reason: FinishReason::Eos,
            matched_stop: String::new(),
            stats: GenerationStats::default(),
        }
    }

    fn deltas(chunks: &[Value]) -> Vec<Value> {
        chunks
            .iter()
            .map(|chunk| {
                let choice = &chunk["choices"][0];
                json!([choice["delta"], choice["logprobs"], choice["finish_reason"]])
            })
            .collect()
    }

    #[test]
    fn chat_streams_text_calls_and_logprobs() {
        let shape = Shape {
            api: Api::Chat,
            logprobs: true,
            tools: Some(ToolOutput {
                syntax: ToolSyntax::Qwen,
                parallel: true,
            }),
        };
        let answer = Answer::new(Api::Chat, "id".into(), "m".into());
        let vocab = Vocab::small();
        let mut relay = Relay::new(shape);
        let mut chunks = relay.chunks(
            &answer,
            &message("Hi <tool", vec![logprob(1, -0.5, &[])]),
            &vocab,
        );
        chunks.extend(relay.chunks(
            &answer,
            &message(
                "_call>{\"name\": \"f\"}</tool_call>",
                vec![logprob(5, -1.0, &[])],
            ),
            &vocab,
        ));
        // A partial character: no text yet, its logprobs on their own.
        chunks.extend(relay.chunks(&answer, &message("", vec![logprob(3, -2.0, &[])]), &vocab));
        chunks.extend(relay.finish(&answer, &ending()));
        let deltas = deltas(&chunks);
        let lp = |token: &str, bytes: Vec<u8>, logprob: f64| json!({"content": [{"token": token, "logprob": logprob, "bytes": bytes, "top_logprobs": []}], "refusal": null});
        assert_eq!(deltas.len(), 4, "{deltas:#?}");
        assert_eq!(
            deltas[0],
            json!([{"content": "Hi "}, lp("Hi", b"Hi".to_vec(), -0.5), null])
        );
        assert_eq!(deltas[1][0]["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(deltas[1][1], lp("!", b"!".to_vec(), -1.0));
        assert_eq!(
            deltas[2],
            json!([{"content": ""}, lp("\u{FFFD}", vec![0xC3], -2.0), null])
        );
        assert_eq!(deltas[3], json!([{}, null, "tool_calls"]));
    }

    #[test]
    fn text_streams_without_tools_or_logprobs() {
        let shape = Shape {
            api: Api::Text,
            logprobs: false,
            tools: None,
        };
        let answer = Answer::new(Api::Text, "id".into(), "m".into());
        let vocab = Vocab::small();
        let mut relay = Relay::new(shape);
        assert_eq!(
            relay.chunks(&answer, &message("", vec![]), &vocab),
            Vec::<Value>::new()
        );
        let chunks = relay.chunks(
            &answer,
            &message("<tool_call>", vec![logprob(1, -0.5, &[])]),
            &vocab,
        );
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0]["choices"][0]["text"], "<tool_call>");
        assert_eq!(chunks[0]["choices"][0]["logprobs"], Value::Null);
        let finish = relay.finish(&answer, &ending());
        assert_eq!(finish[0]["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn completions_logprobs_offsets_run_on_in_a_stream() {
        let shape = Shape {
            api: Api::Text,
            logprobs: true,
            tools: None,
        };
        let answer = Answer::new(Api::Text, "id".into(), "m".into());
        let vocab = Vocab::small();
        let mut relay = Relay::new(shape);
        let first = relay.chunks(&answer, &message("Hi", vec![logprob(1, -0.5, &[])]), &vocab);
        let second = relay.chunks(
            &answer,
            &message(" there", vec![logprob(2, -0.5, &[])]),
            &vocab,
        );
        assert_eq!(
            first[0]["choices"][0]["logprobs"]["text_offset"],
            json!([0])
        );
        assert_eq!(
            second[0]["choices"][0]["logprobs"]["text_offset"],
            json!([2])
        );
    }

    #[test]
    fn whole_choices_split_calls_and_render_logprobs() {
        let vocab = Vocab::small();
        let shape = Shape {
            api: Api::Chat,
            logprobs: false,
            tools: Some(ToolOutput {
                syntax: ToolSyntax::Qwen,
                parallel: true,
            }),
        };
        let choice = whole_choice(
            shape,
            "Checking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>".into(),
            &[],
            &vocab,
        );
        assert_eq!(choice.text, "Checking.");
        assert_eq!(choice.tool_calls.len(), 1);
        assert_eq!(choice.logprobs, None);
        let text = Shape {
            api: Api::Text,
            logprobs: true,
            tools: None,
        };
        let choice = whole_choice(
            text,
            "Hi there".into(),
            &[logprob(1, -0.5, &[]), logprob(2, -0.25, &[])],
            &vocab,
        );
        assert_eq!(choice.text, "Hi there");
        assert_eq!(choice.logprobs.unwrap()["text_offset"], json!([0, 2]));
    }
}
