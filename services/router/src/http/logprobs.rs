//! Log probabilities in OpenAI's two shapes: chat's `logprobs.content` (token, logprob,
//! bytes, top_logprobs per token) and the legacy completions' parallel lists (tokens,
//! token_logprobs, top_logprobs as token → logprob maps, text_offset).

use serde_json::{json, Map, Value};
use specd_text::TargetText;
use specd_wire::generation::TokenLogprob;

/// The logprob OpenAI clients get for a token the sampler could not draw: JSON has no
/// -inf, and vLLM reports this number.
const IMPOSSIBLE: f64 = -9999.0;

/// One token's bytes, from the target's tokenizer.
pub trait TokenBytes {
    fn token_bytes(&self, id: u32) -> Vec<u8>;

    /// The token as text, a partial character as U+FFFD.
    fn token_text(&self, id: u32) -> String {
        String::from_utf8_lossy(&self.token_bytes(id)).into_owned()
    }
}

/// A router without a tokenizer (token-id clients) names tokens by id, as vLLM's
/// `return_tokens_as_token_ids` does.
impl TokenBytes for TargetText {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        TargetText::token_bytes(self, id).unwrap_or_else(|| format!("token_id:{id}").into_bytes())
    }
}

/// A logprob as JSON: the f32's shortest decimal (not its widened f64 digits), and
/// [`IMPOSSIBLE`] for -inf.
fn number(logprob: f32) -> Value {
    if !logprob.is_finite() {
        return json!(IMPOSSIBLE);
    }
    let shortest: f64 = logprob.to_string().parse().unwrap_or(f64::from(logprob));
    json!(shortest)
}

/// Chat's `logprobs.content` entries for `logprobs`.
pub fn chat_content(logprobs: &[TokenLogprob], text: &impl TokenBytes) -> Vec<Value> {
    let entry = |id: u32, logprob: f32| {
        let bytes = text.token_bytes(id);
        let mut entry = Map::new();
        entry.insert(
            "token".into(),
            json!(String::from_utf8_lossy(&bytes).into_owned()),
        );
        entry.insert("logprob".into(), number(logprob));
        entry.insert("bytes".into(), json!(bytes));
        entry
    };
    logprobs
        .iter()
        .map(|token| {
            let mut object = entry(token.token, token.logprob);
            let top: Vec<Value> = token
                .top
                .iter()
                .map(|alt| Value::Object(entry(alt.token, alt.logprob)))
                .collect();
            object.insert("top_logprobs".into(), Value::Array(top));
            Value::Object(object)
        })
        .collect()
}

/// Chat's `logprobs` object.
pub fn chat(logprobs: &[TokenLogprob], text: &impl TokenBytes) -> Value {
    json!({"content": chat_content(logprobs, text), "refusal": null})
}

/// The legacy completions' `logprobs`, whose `text_offset`s run on over the chunks of a
/// stream.
#[derive(Debug, Default)]
pub struct TextLogprobs {
    /// Characters of the completion before the next token.
    offset: usize,
}

impl TextLogprobs {
    pub fn render(&mut self, logprobs: &[TokenLogprob], text: &impl TokenBytes) -> Value {
        let mut tokens = Vec::with_capacity(logprobs.len());
        let mut token_logprobs = Vec::with_capacity(logprobs.len());
        let mut top_logprobs = Vec::with_capacity(logprobs.len());
        let mut text_offset = Vec::with_capacity(logprobs.len());
        for token in logprobs {
            let piece = text.token_text(token.token);
            text_offset.push(json!(self.offset));
            self.offset += piece.chars().count();
            tokens.push(json!(piece));
            token_logprobs.push(number(token.logprob));
            let top: Map<String, Value> = token
                .top
                .iter()
                .map(|alt| (text.token_text(alt.token), number(alt.logprob)))
                .collect();
            top_logprobs.push(Value::Object(top));
        }
        json!({
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs,
            "text_offset": text_offset,
        })
    }
}

#[cfg(test)]
pub mod tests {
    use std::collections::HashMap;

    use specd_wire::generation::TopLogprob;

    use super::*;

    /// Token ids to bytes, for tests.
    pub struct Vocab(pub HashMap<u32, Vec<u8>>);

    impl Vocab {
        /// Tokens 1 "Hi", 2 " there", 3 and 4 the two halves of "é", 5 "!".
        pub fn small() -> Self {
            Self(HashMap::from([
                (1, b"Hi".to_vec()),
                (2, b" there".to_vec()),
                (3, vec![0xC3]),
                (4, vec![0xA9]),
                (5, b"!".to_vec()),
            ]))
        }
    }

    impl TokenBytes for Vocab {
        fn token_bytes(&self, id: u32) -> Vec<u8> {
            self.0.get(&id).cloned().unwrap_or_default()
        }
    }

    pub fn logprob(token: u32, logprob: f32, top: &[(u32, f32)]) -> TokenLogprob {
        TokenLogprob {
            token,
            logprob,
            top: top
                .iter()
                .map(|&(token, logprob)| TopLogprob { token, logprob })
                .collect(),
        }
    }

    #[test]
    fn chat_logprobs_carry_bytes_and_alternatives() {
        let logprobs = [
            logprob(1, -0.1, &[(1, -0.1), (5, -2.5)]),
            logprob(3, f32::NEG_INFINITY, &[]),
        ];
        assert_eq!(
            chat(&logprobs, &Vocab::small()),
            json!({"content": [
                {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": [
                    {"token": "Hi", "logprob": -0.1, "bytes": [72, 105]},
                    {"token": "!", "logprob": -2.5, "bytes": [33]},
                ]},
                {"token": "\u{FFFD}", "logprob": -9999.0, "bytes": [195], "top_logprobs": []},
            ], "refusal": null})
        );
    }

    #[test]
    fn text_offsets_run_on_over_chunks() {
        let vocab = Vocab::small();
        let mut state = TextLogprobs::default();
        let first = state.render(
            &[
                logprob(1, -0.5, &[(1, -0.5), (2, -1.0)]),
                logprob(2, -0.25, &[]),
            ],
            &vocab,
        );
        assert_eq!(
            first,
            json!({
                "tokens": ["Hi", " there"],
                "token_logprobs": [-0.5, -0.25],
                "top_logprobs": [{"Hi": -0.5, " there": -1.0}, {}],
                "text_offset": [0, 2],
            })
        );
        let second = state.render(&[logprob(5, -1.5, &[(5, -1.5)])], &vocab);
        assert_eq!(second["text_offset"], json!([8]));
        assert_eq!(second["top_logprobs"], json!([{"!": -1.5}]));
    }

    #[test]
    fn numbers_are_the_floats_shortest_form() {
        assert_eq!(number(-0.1).to_string(), "-0.1");
        assert_eq!(number(0.0).to_string(), "0.0");
        assert_eq!(number(f32::NAN), json!(IMPOSSIBLE));
    }
}
