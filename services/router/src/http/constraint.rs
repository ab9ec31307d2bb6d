//! The output constraint of a request, from whichever field states it: OpenAI's
//! `response_format`, vLLM's `guided_*` fields, specd's `specd.regex` / `specd.lark`, or a
//! forced tool call. The round loop runs one constraint per request, so a second one is
//! refused by name rather than silently dropped.

use serde_json::Value;
use specd_wire::generation::output_constraint::Kind;
use specd_wire::generation::OutputConstraint;

use super::error::ApiError;

/// A request's constraint and the field it came from, so that the router's errors about it
/// (`constraint.json_schema: ...`) name what the client wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Chosen {
    pub constraint: OutputConstraint,
    pub field: &'static str,
}

/// Gathers the constraints a request states; at most one may be set.
#[derive(Debug, Default)]
pub struct Constraints {
    chosen: Option<Chosen>,
}

impl Constraints {
    /// Adds `kind`, stated by `field`; a 400 naming `field` when another one came first.
    pub fn add(&mut self, field: &'static str, kind: Kind) -> Result<(), ApiError> {
        if let Some(first) = &self.chosen {
            return Err(ApiError::field(
                field,
                format!(
                    "one output constraint per request, and {} already sets one",
                    first.field
                ),
            ));
        }
        self.chosen = Some(Chosen {
            constraint: OutputConstraint { kind: Some(kind) },
            field,
        });
        Ok(())
    }

    pub fn into_chosen(self) -> Option<Chosen> {
        self.chosen
    }
}

/// OpenAI's `response_format`: `text` (none), `json_object`, or `json_schema` with its
/// `schema`.
pub fn response_format(value: &Value) -> Result<Option<Kind>, ApiError> {
    let Some(format) = value.as_object() else {
        return Err(ApiError::field("response_format", "must be an object"));
    };
    let kind = match format.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        Some(_) => return Err(ApiError::field("response_format.type", "must be a string")),
        None => return Err(ApiError::field("response_format.type", "missing field")),
    };
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(Kind::JsonObject(true))),
        "json_schema" => {
            let Some(json_schema) = format.get("json_schema").and_then(Value::as_object) else {
                return Err(ApiError::field(
                    "response_format.json_schema",
                    "an object with the schema is required for type \"json_schema\"",
                ));
            };
            match json_schema.get("schema") {
                Some(schema @ (Value::Object(_) | Value::Bool(_))) => {
                    Ok(Some(Kind::JsonSchema(schema.to_string())))
                }
                Some(_) => Err(ApiError::field(
                    "response_format.json_schema.schema",
                    "must be a JSON Schema object",
                )),
                None => Err(ApiError::field(
                    "response_format.json_schema.schema",
                    "missing field",
                )),
            }
        }
        other => Err(ApiError::field(
            "response_format.type",
            format!("must be \"text\", \"json_object\" or \"json_schema\", not {other:?}"),
        )),
    }
}

/// vLLM's `guided_json`: a schema object, or the schema as a JSON string.
pub fn guided_json(value: &Value) -> Result<Kind, ApiError> {
    match value {
        Value::Object(_) | Value::Bool(_) => Ok(Kind::JsonSchema(value.to_string())),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(_) | Value::Bool(_)) => Ok(Kind::JsonSchema(text.clone())),
            _ => Err(ApiError::field(
                "guided_json",
                "a string must hold a JSON Schema object",
            )),
        },
        _ => Err(ApiError::field(
            "guided_json",
            "must be a JSON Schema object or a string holding one",
        )),
    }
}

/// vLLM's `guided_choice`: the output is one of the strings, as a regex of escaped
/// alternatives.
pub fn guided_choice(choices: &[String]) -> Result<Kind, ApiError> {
    if choices.is_empty() {
        return Err(ApiError::field("guided_choice", "must not be empty"));
    }
    let alternatives: Vec<String> = choices.iter().map(|choice| regex_escape(choice)).collect();
    Ok(Kind::Regex(format!("({})", alternatives.join("|"))))
}

/// `text` as a regex matching exactly it.
fn regex_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~/\"".contains(c) {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn response_formats_become_constraints() {
        assert_eq!(response_format(&json!({"type": "text"})).unwrap(), None);
        assert_eq!(
            response_format(&json!({"type": "json_object"})).unwrap(),
            Some(Kind::JsonObject(true))
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let format = json!({"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": true}});
        let Some(Kind::JsonSchema(text)) = response_format(&format).unwrap() else {
            panic!("not a schema");
        };
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), schema);
    }

    #[test]
    fn bad_response_formats_name_the_field() {
        let cases = [
            (json!("json"), "response_format"),
            (json!({}), "response_format.type"),
            (json!({"type": "yaml"}), "response_format.type"),
            (
                json!({"type": "json_schema"}),
                "response_format.json_schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "x"}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"schema": "x"}}),
                "response_format.json_schema.schema",
            ),
        ];
        for (value, field) in cases {
            let err = response_format(&value).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(field), "{value}");
        }
    }

    #[test]
    fn guided_fields_become_constraints() {
        let schema = json!({"type": "string"});
        assert_eq!(
            guided_json(&schema).unwrap(),
            Kind::JsonSchema(schema.to_string())
        );
        assert_eq!(
            guided_json(&json!("{\"type\": \"string\"}")).unwrap(),
            Kind::JsonSchema("{\"type\": \"string\"}".into())
        );
        assert!(guided_json(&json!("nope")).is_err());
        assert_eq!(
            guided_choice(&["yes".into(), "a.b (c)".into()]).unwrap(),
            Kind::Regex(r"(yes|a\.b \(c\))".into())
        );
        assert!(guided_choice(&[]).is_err());
    }

    #[test]
    fn a_second_constraint_is_refused_by_name() {
        let mut constraints = Constraints::default();
        constraints
            .add("response_format", Kind::JsonObject(true))
            .unwrap();
        let err = constraints
            .add("specd.regex", Kind::Regex("a+".into()))
            .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("specd.regex"));
        assert!(err.message.contains("response_format"), "{}", err.message);
        let chosen = constraints.into_chosen().unwrap();
        assert_eq!(chosen.field, "response_format");
        assert_eq!(chosen.constraint.kind, Some(Kind::JsonObject(true)));
    }
}
