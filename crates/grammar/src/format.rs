//! The output formats a request may ask for, and the llguidance grammar of each.

use llguidance::api::TopLevelGrammar;
use serde_json::Value;

use crate::error::{GrammarError, GrammarErrorKind};
use crate::limits::GrammarLimits;

/// What the output of a request must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// JSON valid under this JSON schema (the schema's text).
    JsonSchema(String),
    /// Text matching this regular expression (Rust `regex` syntax), whole.
    Regex(String),
    /// Text in the language of this Lark grammar (llguidance's Lark dialect).
    Lark(String),
}

impl OutputFormat {
    /// The kind its errors carry.
    pub fn kind(&self) -> GrammarErrorKind {
        match self {
            Self::JsonObject => GrammarErrorKind::JsonObject,
            Self::JsonSchema(_) => GrammarErrorKind::Schema,
            Self::Regex(_) => GrammarErrorKind::Regex,
            Self::Lark(_) => GrammarErrorKind::Lark,
        }
    }

    /// The grammar llguidance compiles. Only the checks that come before llguidance are
    /// made here (sizes, JSON syntax); llguidance reports the rest when it compiles.
    pub(crate) fn grammar(&self, limits: &GrammarLimits) -> Result<TopLevelGrammar, GrammarError> {
        let kind = self.kind();
        let too_big = |len: usize, max: usize| {
            (len > max).then(|| {
                GrammarError::new(
                    kind,
                    format!("{len} bytes is over the limit of {max} bytes"),
                )
            })
        };
        Ok(match self {
            Self::JsonObject => {
                TopLevelGrammar::from_json_schema(serde_json::json!({"type": "object"}))
            }
            Self::JsonSchema(source) => {
                if let Some(error) = too_big(source.len(), limits.max_schema_bytes) {
                    return Err(error);
                }
                let schema: Value = serde_json::from_str(source)
                    .map_err(|e| GrammarError::new(kind, format!("the schema is not JSON: {e}")))?;
                check_object_sizes(&schema, limits.max_object_properties)
                    .map_err(|message| GrammarError::new(kind, message))?;
                TopLevelGrammar::from_json_schema(schema)
            }
            Self::Regex(source) => {
                if let Some(error) = too_big(source.len(), limits.max_grammar_bytes) {
                    return Err(error);
                }
                TopLevelGrammar::from_regex(source)
            }
            Self::Lark(source) => {
                if let Some(error) = too_big(source.len(), limits.max_grammar_bytes) {
                    return Err(error);
                }
                TopLevelGrammar::from_lark(source.clone())
            }
        })
    }
}

/// Refuses a schema with an object of more than `max` properties, anywhere in it.
/// Iterative: the walk must not be what overflows the stack on a deep schema.
fn check_object_sizes(schema: &Value, max: usize) -> Result<(), String> {
    let mut pending = vec![schema];
    while let Some(value) = pending.pop() {
        match value {
            Value::Object(map) => {
                if let Some(Value::Object(properties)) = map.get("properties") {
                    if properties.len() > max {
                        return Err(format!(
                            "an object with {} properties is over the limit of {max}",
                            properties.len()
                        ));
                    }
                }
                pending.extend(map.values());
            }
            Value::Array(items) => pending.extend(items),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_with_too_many_properties_are_found_at_any_depth() {
        let props = |n: usize| -> Value {
            Value::Object(
                (0..n)
                    .map(|i| (format!("p{i}"), serde_json::json!({})))
                    .collect(),
            )
        };
        let nested = serde_json::json!({"anyOf": [{"type": "object", "properties": props(3)}]});
        assert!(check_object_sizes(&nested, 3).is_ok());
        assert!(check_object_sizes(&nested, 2).is_err());
        // A property named "properties" is a name, not a keyword, but counting it is safe.
        let named = serde_json::json!({"properties": {"properties": {"type": "string"}}});
        assert!(check_object_sizes(&named, 1).is_ok());
    }
}
