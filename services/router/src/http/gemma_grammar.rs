//! The Lark grammar (llguidance's dialect) that makes a Gemma 4 model call a function:
//! `<|tool_call>call:NAME{key:value,...}<tool_call|>` with bare keys, strings between
//! `<|"|>` marks, and numbers, booleans, arrays and nested objects as in JSON, each value
//! shaped by the function's JSON Schema (`parameters`) as far as the schema says: typed
//! scalars, enums, required and optional properties in the schema's order, arrays of a
//! typed item; anything else (`anyOf`, `$ref`, untyped) takes any value.

use std::fmt::Write;

use serde_json::Value;

/// Gemma 4's string delimiter, one special token.
const QUOTE: &str = "<|\"|>";

/// Rules of one grammar under construction.
struct Rules {
    text: String,
    next: usize,
}

impl Rules {
    /// A new rule holding `body`; its name.
    fn add(&mut self, body: &str) -> String {
        let name = format!("r{}", self.next);
        self.next += 1;
        let _ = writeln!(self.text, "{name}: {body}");
        name
    }

    /// The rule a value of `schema` takes.
    fn value(&mut self, schema: &Value) -> String {
        if let Some(options) = schema.get("enum").and_then(Value::as_array) {
            let options: Vec<String> = options.iter().filter_map(literal).collect();
            if !options.is_empty() {
                return self.add(&options.join(" | "));
            }
        }
        if let Some(constant) = schema.get("const").and_then(literal) {
            return self.add(&constant);
        }
        match schema.get("type").and_then(Value::as_str) {
            Some("string") => "string".to_owned(),
            Some("integer") => "integer".to_owned(),
            Some("number") => "number".to_owned(),
            Some("boolean") => "boolean".to_owned(),
            Some("null") => "null".to_owned(),
            Some("array") => {
                let item = match schema.get("items") {
                    Some(items) => self.value(items),
                    None => "value".to_owned(),
                };
                self.add(&format!("\"[\" ({item} (\",\" {item})*)? \"]\""))
            }
            Some("object") => match schema.get("properties").and_then(Value::as_object) {
                Some(properties) if !properties.is_empty() => self.object(schema, properties),
                _ => "object".to_owned(),
            },
            _ => "value".to_owned(),
        }
    }

    /// An object of these properties, in their order, the required ones always there.
    fn object(&mut self, schema: &Value, properties: &serde_json::Map<String, Value>) -> String {
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let pairs: Vec<(String, bool)> = properties
            .iter()
            .map(|(key, property)| {
                let value = self.value(property);
                let key_literal = Value::String(format!("{key}:")).to_string();
                (
                    format!("{key_literal} {value}"),
                    required.contains(&key.as_str()),
                )
            })
            .collect();
        // Built from the last pair back: `tail[0]` holds the pairs from here on after a pair
        // was written (each with its leading comma), `tail[1]` the same before any was
        // (the first one written takes no comma); None is nothing left. An optional pair
        // may be left out.
        let mut tail: [Option<String>; 2] = [None, None];
        for (pair, required) in pairs.iter().rev() {
            let mut next: [Option<String>; 2] = [None, None];
            for (slot, lead) in [(0, "\",\" "), (1, "")] {
                let written = match &tail[0] {
                    Some(rest) => format!("{lead}{pair} {rest}"),
                    None => format!("{lead}{pair}"),
                };
                let body = match (required, &tail[slot]) {
                    (true, _) => written,
                    (false, Some(skipped)) => format!("{written} | {skipped}"),
                    (false, None) => format!("({written})?"),
                };
                next[slot] = Some(self.add(&body));
            }
            tail = next;
        }
        match &tail[1] {
            Some(pairs) => self.add(&format!("\"{{\" {pairs} \"}}\"")),
            None => "object".to_owned(),
        }
    }
}

/// A JSON scalar as Gemma writes it, as a Lark expression.
fn literal(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(format!("{QUOTE} {} {QUOTE}", Value::String(text.clone()))),
        Value::Number(n) => Some(Value::String(n.to_string()).to_string()),
        Value::Bool(b) => Some(Value::String(b.to_string()).to_string()),
        Value::Null => Some("\"null\"".to_owned()),
        _ => None,
    }
}

/// Scalars and the value of no particular shape.
const COMMON: &str = r#"string: <|"|> /[^<]*/ <|"|>
integer: /-?(0|[1-9][0-9]*)/
number: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/
boolean: "true" | "false"
null: "null"
value: string | number | boolean | null | object | "[" (value ("," value)*)? "]"
object: "{" (/[A-Za-z_][A-Za-z0-9_]*/ ":" value ("," /[A-Za-z_][A-Za-z0-9_]*/ ":" value)*)? "}"
"#;

/// The grammar forcing one call of one of `functions` (name, parameters schema), or
/// several in a row when `parallel`.
pub fn gemma_grammar(functions: &[(&str, &Value)], parallel: bool) -> String {
    let mut rules = Rules {
        text: String::new(),
        next: 0,
    };
    let calls: Vec<String> = functions
        .iter()
        .map(|(name, parameters)| {
            let arguments = match parameters.get("properties").and_then(Value::as_object) {
                Some(properties) if !properties.is_empty() => rules.object(parameters, properties),
                _ => "object".to_owned(),
            };
            let name = Value::String(format!("call:{name}")).to_string();
            rules.add(&format!("{name} {arguments}"))
        })
        .collect();
    let call = format!("<|tool_call> ({}) <tool_call|>", calls.join(" | "));
    let start = if parallel { "call+" } else { "call" };
    format!("start: {start}\ncall: {call}\n{}{COMMON}", rules.text)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_function_with_typed_required_and_optional_parameters() {
        let parameters = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
            },
            "required": ["city"],
        });
        let grammar = gemma_grammar(&[("get_weather", &parameters)], false);
        assert!(
            grammar.starts_with("start: call\ncall: <|tool_call> (r"),
            "{grammar}"
        );
        assert!(grammar.contains(r#""call:get_weather" r"#), "{grammar}");
        assert!(grammar.contains(r#"<|"|> "celsius" <|"|> | <|"|> "fahrenheit" <|"|>"#));
        assert!(grammar.contains(r#""city:" string"#), "{grammar}");
        assert!(grammar.contains(r#"",""#), "{grammar}");
    }

    #[test]
    fn several_functions_are_alternatives_and_parallel_calls_repeat() {
        let empty = json!({"type": "object"});
        let grammar = gemma_grammar(&[("ping", &empty), ("pong", &empty)], true);
        assert!(grammar.starts_with("start: call+\n"), "{grammar}");
        assert!(grammar.contains(r#""call:ping" object"#), "{grammar}");
        assert!(grammar.contains(r#""call:pong" object"#), "{grammar}");
    }

    /// The Gemma 4 tokenizer fixture's vocabulary for grammars.
    fn gemma_tokens() -> (tokenizers::Tokenizer, specd_grammar::GrammarTokens) {
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../crates/text/tests/fixtures");
        let tokenizer =
            tokenizers::Tokenizer::from_file(fixtures.join("gemma4-tokenizer.hf.json")).unwrap();
        let eos = tokenizer.token_to_id("<eos>").unwrap();
        let vocab = tokenizer.get_vocab_size(true);
        let tokens = specd_grammar::GrammarTokens::new(&tokenizer, &[eos], vocab).unwrap();
        (tokenizer, tokens)
    }

    /// Whether the grammar lets `text` out token by token, to its end.
    fn walks(
        grammar: &str,
        text: &str,
        tokenizer: &tokenizers::Tokenizer,
        tokens: &specd_grammar::GrammarTokens,
    ) -> bool {
        use specd_core::TokenConstraint;
        let format = specd_grammar::OutputFormat::Lark(grammar.to_owned());
        let mut constraint = tokens
            .compile(&format, &specd_grammar::GrammarLimits::default())
            .unwrap_or_else(|e| panic!("{e}\n{grammar}"));
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        for id in ids {
            if !constraint.next_mask().unwrap().allows(id) || constraint.commit(&[id]).is_err() {
                return false;
            }
        }
        constraint.is_complete()
            || constraint
                .next_mask()
                .unwrap()
                .allows(tokenizer.token_to_id("<eos>").unwrap())
    }

    #[test]
    fn the_grammar_lets_out_exactly_the_calls_the_schema_allows() {
        let (tokenizer, tokens) = gemma_tokens();
        let parameters = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
                "hourly": {"type": "boolean"},
            },
            "required": ["city", "days"],
        });
        let grammar = gemma_grammar(&[("get_weather", &parameters)], false);
        let call = |args: &str| format!("<|tool_call>call:get_weather{{{args}}}<tool_call|>");
        let q = QUOTE;
        for good in [
            format!("city:{q}Paris{q},days:3"),
            format!("city:{q}Paris{q},unit:{q}celsius{q},days:3,hourly:true"),
            format!("city:{q}Paris{q},days:-1,hourly:false"),
        ] {
            assert!(walks(&grammar, &call(&good), &tokenizer, &tokens), "{good}");
            let whole = call(&good);
            let body = whole
                .strip_prefix("<|tool_call>")
                .and_then(|rest| rest.strip_suffix("<tool_call|>"))
                .unwrap();
            let (name, arguments) =
                crate::http::gemma_args::parse_call(body).unwrap_or_else(|| panic!("{good}"));
            assert_eq!(name, "get_weather");
            assert!(arguments["city"].is_string() && arguments["days"].is_i64());
        }
        for bad in [
            format!("city:{q}Paris{q}"),
            format!("days:3,city:{q}Paris{q}"),
            format!("city:{q}Paris{q},unit:{q}kelvin{q},days:3"),
            format!("city:{q}Paris{q},days:3.5"),
            format!("city:{q}Paris{q},days:3,wind:1"),
        ] {
            assert!(!walks(&grammar, &call(&bad), &tokenizer, &tokens), "{bad}");
        }
        let other = "<|tool_call>call:get_time{}<tool_call|>";
        assert!(!walks(&grammar, other, &tokenizer, &tokens));
    }
}
