//! A chat request's tools: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls`
//! checked, the definitions handed to the chat template, and for `required` or a named
//! function the grammar that makes the model call one.

use serde_json::{json, Value};

use super::error::ApiError;
use super::gemma_grammar::gemma_grammar;
use super::tool_calls::ToolSyntax;

/// What a request's tool fields ask for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolUse {
    /// The chat template's `tools` variable (the definitions as the client sent them);
    /// None with `tool_choice: "none"`, which renders the prompt without tools.
    pub template_tools: Option<Value>,
    /// The Lark grammar (llguidance's dialect) that forces a call, for `required` or a
    /// named function.
    pub grammar: Option<String>,
    /// How to read calls out of the output; None when the model may not call any.
    pub output: Option<ToolOutput>,
}

/// How to read the output's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolOutput {
    pub syntax: ToolSyntax,
    pub parallel: bool,
}

/// A function tool as checked: its name and the JSON Schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
struct Function {
    name: String,
    parameters: Value,
}

/// The request's tool fields; None when it has no tools (and its `tool_choice` asks for
/// none).
pub fn tool_use(
    tools: Option<&[Value]>,
    tool_choice: Option<&Value>,
    parallel_tool_calls: Option<bool>,
    syntax: ToolSyntax,
) -> Result<Option<ToolUse>, ApiError> {
    let tools = tools.unwrap_or_default();
    let functions = tools
        .iter()
        .enumerate()
        .map(|(i, tool)| function(i, tool))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some((i, function)) = functions
        .iter()
        .enumerate()
        .find(|(i, f)| functions[..*i].iter().any(|g| g.name == f.name))
    {
        return Err(ApiError::field(
            format!("tools[{i}].function.name"),
            format!("{:?} is defined twice", function.name),
        ));
    }
    let choice = Choice::parse(tool_choice, &functions)?;
    if functions.is_empty() {
        return match choice {
            Choice::None | Choice::Auto => Ok(None),
            Choice::Required | Choice::Named(_) => Err(ApiError::field(
                "tool_choice",
                "the request has no tools to call",
            )),
        };
    }
    let parallel = parallel_tool_calls.unwrap_or(true);
    let output = Some(ToolOutput { syntax, parallel });
    let template_tools = Some(Value::Array(tools.to_vec()));
    let forced = match choice {
        Choice::None => {
            return Ok(Some(ToolUse {
                template_tools: None,
                grammar: None,
                output: None,
            }))
        }
        Choice::Auto => None,
        Choice::Required => Some(functions.as_slice()),
        Choice::Named(i) => Some(&functions[i..=i]),
    };
    let grammar = match forced {
        None => None,
        Some(forced) => match syntax {
            ToolSyntax::Qwen => Some(qwen_grammar(forced, parallel)),
            ToolSyntax::Gemma4 => {
                let functions: Vec<(&str, &Value)> = forced
                    .iter()
                    .map(|f| (f.name.as_str(), &f.parameters))
                    .collect();
                Some(gemma_grammar(&functions, parallel))
            }
        },
    };
    Ok(Some(ToolUse {
        template_tools,
        grammar,
        output,
    }))
}

/// `tools[i]`: `{"type": "function", "function": {"name", "description"?, "parameters"?}}`.
fn function(i: usize, tool: &Value) -> Result<Function, ApiError> {
    let field = |name: &str| format!("tools[{i}]{name}");
    let Some(tool) = tool.as_object() else {
        return Err(ApiError::field(field(""), "must be an object"));
    };
    match tool.get("type") {
        Some(Value::String(kind)) if kind == "function" => {}
        Some(Value::String(kind)) => {
            return Err(ApiError::field(
                field(".type"),
                format!("only \"function\" tools are supported, not {kind:?}"),
            ))
        }
        _ => return Err(ApiError::field(field(".type"), "must be \"function\"")),
    }
    let Some(function) = tool.get("function").and_then(Value::as_object) else {
        return Err(ApiError::field(field(".function"), "must be an object"));
    };
    let name = match function.get("name") {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => {
            return Err(ApiError::field(
                field(".function.name"),
                "must be a non-empty string",
            ))
        }
    };
    if let Some(description) = function.get("description") {
        if !description.is_string() && !description.is_null() {
            return Err(ApiError::field(
                field(".function.description"),
                "must be a string",
            ));
        }
    }
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object"}),
        Some(schema @ Value::Object(_)) => schema.clone(),
        Some(_) => {
            return Err(ApiError::field(
                field(".function.parameters"),
                "must be a JSON Schema object",
            ))
        }
    };
    Ok(Function { name, parameters })
}

/// `tool_choice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    None,
    Auto,
    Required,
    /// The function at this index of the tools.
    Named(usize),
}

impl Choice {
    fn parse(value: Option<&Value>, functions: &[Function]) -> Result<Self, ApiError> {
        let named = |name: &str| {
            functions
                .iter()
                .position(|f| f.name == name)
                .map(Choice::Named)
                .ok_or_else(|| {
                    ApiError::field(
                        "tool_choice",
                        format!("names function {name:?}, which is not among the tools"),
                    )
                })
        };
        match value {
            None | Some(Value::Null) => Ok(Self::Auto),
            Some(Value::String(choice)) => match choice.as_str() {
                "auto" => Ok(Self::Auto),
                "none" => Ok(Self::None),
                "required" => Ok(Self::Required),
                other => Err(ApiError::field(
                    "tool_choice",
                    format!(
                        "must be \"auto\", \"none\", \"required\" or a function, not {other:?}"
                    ),
                )),
            },
            Some(Value::Object(choice)) => {
                let name = choice
                    .get("function")
                    .and_then(|function| function.get("name"))
                    .and_then(Value::as_str);
                match (choice.get("type").and_then(Value::as_str), name) {
                    (Some("function"), Some(name)) => named(name),
                    _ => Err(ApiError::field(
                        "tool_choice",
                        "an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )),
                }
            }
            Some(_) => Err(ApiError::field(
                "tool_choice",
                "must be a string or a function object",
            )),
        }
    }
}

/// Qwen's call markup around a JSON object naming one of `functions` with arguments
/// valid against its schema; one call, or several one per line when `parallel`. The schema
/// is written out by hand so that `name` comes before `arguments` (llguidance generates
/// properties in the schema's order, and Qwen writes the name first).
fn qwen_grammar(functions: &[Function], parallel: bool) -> String {
    let objects: Vec<String> = functions
        .iter()
        .map(|function| {
            format!(
                "{{\"type\": \"object\", \"properties\": {{\"name\": {{\"const\": {}}}, \
                 \"arguments\": {}}}, \"required\": [\"name\", \"arguments\"], \
                 \"additionalProperties\": false}}",
                Value::String(function.name.clone()),
                function.parameters
            )
        })
        .collect();
    let schema = match objects.as_slice() {
        [one] => one.clone(),
        many => format!("{{\"anyOf\": [{}]}}", many.join(", ")),
    };
    let start = if parallel {
        "start: tool_call (\"\\n\" tool_call)*"
    } else {
        "start: tool_call"
    };
    format!(
        "{start}\ntool_call: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {schema}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather now",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        })
    }

    fn ping() -> Value {
        json!({"type": "function", "function": {"name": "ping"}})
    }

    #[test]
    fn auto_renders_tools_and_reads_calls_without_forcing() {
        let tools = [weather(), ping()];
        let use_ = tool_use(Some(&tools), None, None, ToolSyntax::Qwen)
            .unwrap()
            .unwrap();
        assert_eq!(use_.template_tools, Some(json!([weather(), ping()])));
        assert_eq!(use_.grammar, None);
        assert_eq!(
            use_.output,
            Some(ToolOutput {
                syntax: ToolSyntax::Qwen,
                parallel: true
            })
        );
        let auto = json!("auto");
        let explicit = tool_use(Some(&tools), Some(&auto), Some(false), ToolSyntax::Gemma4)
            .unwrap()
            .unwrap();
        assert_eq!(
            explicit.output,
            Some(ToolOutput {
                syntax: ToolSyntax::Gemma4,
                parallel: false
            })
        );
    }

    #[test]
    fn none_renders_without_tools() {
        let none = json!("none");
        let use_ = tool_use(Some(&[weather()]), Some(&none), None, ToolSyntax::Qwen)
            .unwrap()
            .unwrap();
        assert_eq!(
            use_,
            ToolUse {
                template_tools: None,
                grammar: None,
                output: None
            }
        );
        assert_eq!(
            tool_use(None, Some(&none), None, ToolSyntax::Qwen).unwrap(),
            None
        );
        assert_eq!(
            tool_use(Some(&[]), None, None, ToolSyntax::Qwen).unwrap(),
            None
        );
    }

    #[test]
    fn a_named_function_gets_a_grammar_for_its_call_alone() {
        let choice = json!({"type": "function", "function": {"name": "get_weather"}});
        let use_ = tool_use(
            Some(&[ping(), weather()]),
            Some(&choice),
            Some(false),
            ToolSyntax::Qwen,
        )
        .unwrap()
        .unwrap();
        // The arguments' schema is the client's, as serde_json writes it.
        let parameters = weather()["function"]["parameters"].to_string();
        let expected = format!(
            "start: tool_call\n\
             tool_call: \"<tool_call>\\n\" call \"\\n</tool_call>\"\n\
             call: %json {{\"type\": \"object\", \"properties\": {{\"name\": {{\"const\": \
             \"get_weather\"}}, \"arguments\": {parameters}}}, \"required\": [\"name\", \
             \"arguments\"], \"additionalProperties\": false}}\n"
        );
        assert_eq!(use_.grammar.as_deref(), Some(expected.as_str()));
        assert!(use_.template_tools.is_some() && use_.output.is_some());
    }

    #[test]
    fn required_lets_the_model_pick_among_all_tools() {
        let required = json!("required");
        let grammar = tool_use(
            Some(&[weather(), ping()]),
            Some(&required),
            None,
            ToolSyntax::Qwen,
        )
        .unwrap()
        .unwrap()
        .grammar
        .unwrap();
        assert!(
            grammar.starts_with("start: tool_call (\"\\n\" tool_call)*\n"),
            "{grammar}"
        );
        assert!(grammar.contains("call: %json {\"anyOf\": [{"), "{grammar}");
        assert!(grammar.contains("{\"const\": \"get_weather\"}"));
        assert!(grammar.contains("{\"const\": \"ping\"}, \"arguments\": {\"type\":\"object\"}"));
        let gemma = tool_use(
            Some(&[weather(), ping()]),
            Some(&required),
            None,
            ToolSyntax::Gemma4,
        )
        .unwrap()
        .unwrap()
        .grammar
        .unwrap();
        assert!(gemma.starts_with("start: call+\n"), "{gemma}");
        assert!(gemma.contains("\"call:get_weather\""), "{gemma}");
        assert!(gemma.contains("\"call:ping\""), "{gemma}");
    }

    #[test]
    fn bad_tools_and_choices_are_named() {
        let named = |name: &str| json!({"type": "function", "function": {"name": name}});
        let cases: Vec<(Vec<Value>, Option<Value>, &str)> = vec![
            (vec![json!("f")], None, "tools[0]"),
            (
                vec![ping(), json!({"type": "retrieval"})],
                None,
                "tools[1].type",
            ),
            (vec![json!({"type": "function"})], None, "tools[0].function"),
            (
                vec![json!({"type": "function", "function": {"name": ""}})],
                None,
                "tools[0].function.name",
            ),
            (
                vec![json!({"type": "function", "function": {"name": "f", "parameters": "x"}})],
                None,
                "tools[0].function.parameters",
            ),
            (
                vec![json!({"type": "function", "function": {"name": "f", "description": 1}})],
                None,
                "tools[0].function.description",
            ),
            (vec![ping(), ping()], None, "tools[1].function.name"),
            (vec![ping()], Some(named("pong")), "tool_choice"),
            (vec![ping()], Some(json!("sometimes")), "tool_choice"),
            (
                vec![ping()],
                Some(json!({"type": "function"})),
                "tool_choice",
            ),
            (vec![ping()], Some(json!(3)), "tool_choice"),
            (vec![], Some(json!("required")), "tool_choice"),
            (vec![], Some(named("ping")), "tool_choice"),
        ];
        for (tools, choice, field) in cases {
            let err = tool_use(Some(&tools), choice.as_ref(), None, ToolSyntax::Qwen).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(field), "{tools:?} {choice:?}");
        }
    }
}
