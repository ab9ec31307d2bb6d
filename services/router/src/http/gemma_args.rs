//! Gemma 4's tool-call arguments as JSON. Its chat template writes a call as
//! `call:NAME{key:value,...}` with bare keys, strings between `<|"|>` marks (no escaping
//! inside), and numbers, booleans, nested objects and arrays as in JSON; clients want a
//! JSON object.

use serde_json::{Map, Value};

/// Gemma 4's string delimiter (one token).
const QUOTE: &str = "<|\"|>";

/// `call:NAME{...}` as the function's name and its arguments; None when the text is not
/// one call.
pub fn parse_call(body: &str) -> Option<(String, Value)> {
    let rest = body.trim().strip_prefix("call:")?;
    let open = rest.find('{')?;
    let name = rest[..open].trim();
    if name.is_empty() {
        return None;
    }
    let mut reader = Reader {
        text: &rest[open..],
    };
    let arguments = reader.object()?;
    reader
        .text
        .trim()
        .is_empty()
        .then(|| (name.to_owned(), arguments))
}

struct Reader<'a> {
    /// What is left to read.
    text: &'a str,
}

impl Reader<'_> {
    fn skip_space(&mut self) {
        self.text = self.text.trim_start();
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip_space();
        match self.text.strip_prefix(token) {
            Some(rest) => {
                self.text = rest;
                true
            }
            None => false,
        }
    }

    fn value(&mut self) -> Option<Value> {
        self.skip_space();
        if self.text.starts_with('{') {
            self.object()
        } else if self.text.starts_with('[') {
            self.array()
        } else if self.text.starts_with(QUOTE) {
            self.quoted().map(Value::String)
        } else {
            self.bare()
        }
    }

    fn object(&mut self) -> Option<Value> {
        if !self.eat("{") {
            return None;
        }
        let mut object = Map::new();
        if self.eat("}") {
            return Some(Value::Object(object));
        }
        loop {
            let key = self.key()?;
            if !self.eat(":") {
                return None;
            }
            let value = self.value()?;
            object.insert(key, value);
            if self.eat("}") {
                return Some(Value::Object(object));
            }
            if !self.eat(",") {
                return None;
            }
        }
    }

    fn array(&mut self) -> Option<Value> {
        if !self.eat("[") {
            return None;
        }
        let mut items = Vec::new();
        if self.eat("]") {
            return Some(Value::Array(items));
        }
        loop {
            items.push(self.value()?);
            if self.eat("]") {
                return Some(Value::Array(items));
            }
            if !self.eat(",") {
                return None;
            }
        }
    }

    /// A bare key, a quoted one, or (leniently) a JSON string.
    fn key(&mut self) -> Option<String> {
        self.skip_space();
        if self.text.starts_with(QUOTE) {
            return self.quoted();
        }
        if self.text.starts_with('"') {
            return match self.bare()? {
                Value::String(key) => Some(key),
                _ => None,
            };
        }
        let end = self.text.find(':')?;
        let key = self.text[..end].trim();
        if key.is_empty() || key.contains([',', '{', '}', '[', ']']) {
            return None;
        }
        self.text = &self.text[end..];
        Some(key.to_owned())
    }

    fn quoted(&mut self) -> Option<String> {
        let rest = self.text.strip_prefix(QUOTE)?;
        let end = rest.find(QUOTE)?;
        self.text = &rest[end + QUOTE.len()..];
        Some(rest[..end].to_owned())
    }

    /// A number, boolean, null or JSON string; other bare text as a string, as the model
    /// sometimes leaves quotes out.
    fn bare(&mut self) -> Option<Value> {
        let end = if self.text.starts_with('"') {
            json_string_end(self.text)?
        } else {
            self.text.find([',', '}', ']']).unwrap_or(self.text.len())
        };
        let raw = self.text[..end].trim();
        self.text = &self.text[end..];
        if raw.is_empty() {
            return None;
        }
        Some(serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned())))
    }
}

/// The byte just past the JSON string `text` opens with.
fn json_string_end(text: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in text.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i + 1),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn gemma_calls_read_as_json_arguments() {
        let (name, arguments) = parse_call(
            r#"call:get_weather{city:<|"|>Paris, "FR" {x}<|"|>,days:3,metric:true,none:null,tags:[<|"|>a<|"|>,2],nested:{deep:<|"|>y<|"|>},ratio:-0.5}"#,
        )
        .unwrap();
        assert_eq!(name, "get_weather");
        assert_eq!(
            arguments,
            json!({
                "city": "Paris, \"FR\" {x}",
                "days": 3,
                "metric": true,
                "none": null,
                "tags": ["a", 2],
                "nested": {"deep": "y"},
                "ratio": -0.5,
            })
        );
    }

    #[test]
    fn empty_lenient_and_broken_calls() {
        assert_eq!(
            parse_call("call:tools.ping-now{}"),
            Some(("tools.ping-now".into(), json!({})))
        );
        assert_eq!(
            parse_call(r#"call:f{"a": "x,y", b: plain words}"#),
            Some(("f".into(), json!({"a": "x,y", "b": "plain words"})))
        );
        for broken in [
            "f{a:1}",
            "call:{a:1}",
            "call:f{a:1",
            "call:f{a:<|\"|>open}",
            "call:f{a:1} trailing",
            "call:f{:1}",
            "call:f{a:1,,b:2}",
        ] {
            assert_eq!(parse_call(broken), None, "{broken}");
        }
    }
}
