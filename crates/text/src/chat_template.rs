//! The chat prompt: the model's own Jinja chat template (`tokenizer.chat_template`), rendered
//! with minijinja under the settings Hugging Face uses (trim_blocks, lstrip_blocks) and with
//! the Python string, list and dict methods templates call.

use candle_core::quantized::gguf_file::Value;
use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::{context, Environment, ErrorKind};
use serde::Serialize;

use crate::error::{Result, TextError};
use crate::gguf_metadata::{string_array, value_usize, Metadata};

/// The Qwen 2.5 chat template, used when the GGUF carries none.
pub const QWEN2_5_CHAT_TEMPLATE: &str = include_str!("qwen2_5_chat_template.jinja");

const TEMPLATE_NAME: &str = "chat";

/// Variables a request hands the chat template beside its messages, as vLLM's
/// `chat_template_kwargs` (e.g. `{"enable_thinking": true}` for Gemma 4's template).
pub type TemplateVariables = serde_json::Map<String, serde_json::Value>;

/// The variables the renderer sets itself.
pub const RENDERER_VARIABLES: [&str; 4] = [
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// The functions an assistant turn called. Left out of the template's view when empty,
    /// because templates test `message.tool_calls is defined` as well as its truth.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<ToolCall>,
    /// Which call a `tool` turn answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<String>,
    /// Who speaks: the function a `tool` turn answers for, or a participant's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
}

/// One call as chat templates read it, OpenAI's shape with the arguments as a JSON value
/// rather than a string: Qwen 2.5's template writes `tool_call.arguments | tojson`, which
/// would quote a string a second time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct ToolCall {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    function: CalledFunction,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct CalledFunction {
    name: String,
    arguments: serde_json::Value,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }

    /// Adds a function call to an assistant turn. Arguments that are not JSON reach the
    /// template as a string: the HTTP API refuses them before, and a template can still
    /// show them.
    pub fn with_tool_call(
        mut self,
        id: impl Into<String>,
        name: impl Into<String>,
        arguments_json: &str,
    ) -> Self {
        let arguments = serde_json::from_str(arguments_json)
            .unwrap_or_else(|_| serde_json::Value::String(arguments_json.to_owned()));
        self.tool_calls.push(ToolCall {
            id: id.into(),
            kind: "function",
            function: CalledFunction {
                name: name.into(),
                arguments,
            },
        });
        self
    }

    /// The call a `tool` turn answers; empty (protobuf's unset) leaves it out.
    pub fn with_tool_call_id(mut self, id: impl Into<String>) -> Self {
        self.tool_call_id = Some(id.into()).filter(|id| !id.is_empty());
        self
    }

    /// The turn's `name`; empty (protobuf's unset) leaves it out.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into()).filter(|name| !name.is_empty());
        self
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    /// The tokenizer's special tokens as templates name them (`{{ bos_token }}`); empty when
    /// the checkpoint does not say.
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles a Jinja chat template.
    pub fn new(source: impl Into<String>) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()?;
        env.set_syntax(syntax);
        // Templates are written for Python's Jinja: Gemma 4's calls str.split on assistant
        // turns, others str.strip, dict.items and the like.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // Hugging Face replaces Jinja's `tojson` by json.dumps without sorting or HTML
        // escaping; minijinja's escapes `<`, `>`, `&` and `'`, which would show tool
        // descriptions and arguments to the model otherwise than it was trained on.
        env.add_filter("tojson", python_tojson);
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(TEMPLATE_NAME, source.into())?;
        Ok(Self {
            env,
            bos_token: String::new(),
            eos_token: String::new(),
        })
    }

    /// The strings `{{ bos_token }}` and `{{ eos_token }}` render as.
    pub fn with_special_tokens(mut self, bos_token: String, eos_token: String) -> Self {
        self.bos_token = bos_token;
        self.eos_token = eos_token;
        self
    }

    /// The GGUF's `tokenizer.chat_template`, or the Qwen 2.5 template when it has none.
    pub fn from_gguf_metadata(metadata: &Metadata) -> Result<Self> {
        match metadata.get("tokenizer.chat_template") {
            Some(Value::String(source)) => Self::new(source.clone()),
            Some(other) => Err(TextError::field(
                "tokenizer.chat_template",
                format!("expected a string, found {:?}", other.value_type()),
            )),
            None => {
                tracing::info!("GGUF has no tokenizer.chat_template; using the Qwen 2.5 template");
                Self::qwen2_5()
            }
        }
    }

    /// The chat template of a GGUF target, `{{ bos_token }}` and `{{ eos_token }}` rendering
    /// as the tokens the file's bos/eos ids name (Gemma 4's template opens with the BOS). A
    /// file without a template gets the Qwen 2.5 one when its vocabulary is byte-level BPE
    /// (the Qwen family), and none otherwise.
    pub fn for_gguf_target(metadata: &Metadata) -> Result<Option<Self>> {
        let byte_level = matches!(
            metadata.get("tokenizer.ggml.model"),
            Some(Value::String(model)) if model == "gpt2"
        );
        if !byte_level && !metadata.contains_key("tokenizer.chat_template") {
            return Ok(None);
        }
        let template = Self::from_gguf_metadata(metadata)?;
        let token = |field: &str| -> Result<String> {
            let Some(value) = metadata.get(field) else {
                return Ok(String::new());
            };
            let id = value_usize(value, field)?;
            let tokens = string_array(metadata, "tokenizer.ggml.tokens")?;
            tokens.get(id).map(|t| t.to_string()).ok_or_else(|| {
                TextError::field(field, format!("{id} is past the {} tokens", tokens.len()))
            })
        };
        Ok(Some(template.with_special_tokens(
            token("tokenizer.ggml.bos_token_id")?,
            token("tokenizer.ggml.eos_token_id")?,
        )))
    }

    pub fn qwen2_5() -> Result<Self> {
        Self::new(QWEN2_5_CHAT_TEMPLATE)
    }

    /// The prompt for `messages`; with `add_generation_prompt` it ends by opening the
    /// assistant's turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, &TemplateVariables::new())
    }

    /// [`Self::render`] with more variables for the template (such as Gemma 4's
    /// `enable_thinking`), none of them one the renderer sets itself.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        variables: &TemplateVariables,
    ) -> Result<String> {
        if let Some(name) = variables
            .keys()
            .find(|name| RENDERER_VARIABLES.contains(&name.as_str()))
        {
            return Err(TextError::TemplateVariable {
                name: name.clone(),
                message: "set by the renderer; a request cannot replace it".into(),
            });
        }
        let template = self.env.get_template(TEMPLATE_NAME)?;
        Ok(template.render(context! {
            messages => Serde(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            ..Serde(variables)
        })?)
    }
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`: `", "` and `": "`
/// between items, or one item per line under `indent`.
fn python_tojson(
    value: &minijinja::Value,
    indent: Option<minijinja::Value>,
    kwargs: minijinja::value::Kwargs,
) -> std::result::Result<minijinja::Value, minijinja::Error> {
    let indent = match indent {
        Some(indent) => Some(indent),
        None => kwargs.get::<Option<minijinja::Value>>("indent")?,
    };
    // Accepted for Hugging Face's signature, as its defaults (no ASCII escaping, no key
    // sorting, its separators): a template that passes them still renders.
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<minijinja::Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(value) if value.is_none() => None,
        Some(value) => Some(usize::try_from(value)?),
    };
    let mut out = Vec::new();
    let written = match indent {
        None => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            PythonFormatter,
        )),
        Some(width) => {
            let spaces = " ".repeat(width);
            value.serialize(&mut serde_json::Serializer::with_formatter(
                &mut out,
                serde_json::ser::PrettyFormatter::with_indent(spaces.as_bytes()),
            ))
        }
    };
    written.map_err(|e| {
        minijinja::Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON")
            .with_source(e)
    })?;
    let text = String::from_utf8(out).map_err(|e| {
        minijinja::Error::new(ErrorKind::InvalidOperation, "JSON is not UTF-8").with_source(e)
    })?;
    Ok(minijinja::Value::from_safe_string(text))
}

/// json.dumps' default separators.
struct PythonFormatter;

/// `", "` before every item but the first, of arrays and objects alike.
fn item_separator<W: ?Sized + std::io::Write>(writer: &mut W, first: bool) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        writer.write_all(b", ")
    }
}

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        item_separator(writer, first)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        item_separator(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A template with a switch as Gemma 4's `enable_thinking`.
    const SWITCHED: &str = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}\
        {% endfor %}{% if add_generation_prompt %}<model>{% if not enable_thinking %}<no-thought>\
        {% endif %}{% endif %}";

    #[test]
    fn qwen_renders_tools_calls_and_responses_as_hugging_face_does() {
        let template = ChatTemplate::qwen2_5().unwrap();
        // Keys in sorted order, so that the map's order does not matter here.
        let tools = serde_json::json!([{
            "function": {
                "description": "Today's weather <in> a city & more",
                "name": "get_weather",
                "parameters": {"properties": {"city": {"type": "string"}}, "type": "object"},
            },
            "type": "function",
        }]);
        let mut variables = TemplateVariables::new();
        variables.insert("tools".into(), tools);
        let messages = [
            ChatMessage::user("Weather in Paris?"),
            ChatMessage::assistant("").with_tool_call(
                "call_1",
                "get_weather",
                r#"{"city":"Paris"}"#,
            ),
            ChatMessage::new("tool", "sunny")
                .with_tool_call_id("call_1")
                .with_name("get_weather"),
        ];
        let rendered = template.render_with(&messages, true, &variables).unwrap();
        let expected = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a \
            helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with \
            the user query.\n\nYou are provided with function signatures within <tools></tools> \
            XML tags:\n<tools>\n{\"function\": {\"description\": \"Today's weather <in> a city & \
            more\", \"name\": \"get_weather\", \"parameters\": {\"properties\": {\"city\": \
            {\"type\": \"string\"}}, \"type\": \"object\"}}, \"type\": \"function\"}\n</tools>\n\n\
            For each function call, return a json object with function name and arguments within \
            <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \
            \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n\
            <|im_start|>user\nWeather in Paris?<|im_end|>\n\
            <|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
            {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n\
            <|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n\
            <|im_start|>assistant\n";
        assert_eq!(rendered, expected);
    }

    #[test]
    fn turns_without_tool_fields_show_none_to_the_template() {
        let template = ChatTemplate::new(
            "{% for m in messages %}{{ m.tool_calls is defined }} {{ m.tool_call_id is defined }} \
             {{ m.name is defined }};{% endfor %}",
        )
        .unwrap();
        let messages = [
            ChatMessage::user("hi").with_name("").with_tool_call_id(""),
            ChatMessage::assistant("").with_tool_call("c", "f", "not json"),
        ];
        assert_eq!(
            template.render(&messages, false).unwrap(),
            "False False False;True False False;"
        );
        let arguments = ChatTemplate::new(
            "{{ messages[0].tool_calls[0].function.arguments | tojson }} \
             {{ {'a': [1, 2]} | tojson(indent=2) }}",
        )
        .unwrap();
        assert_eq!(
            arguments.render(&messages[1..], false).unwrap(),
            "\"not json\" {\n  \"a\": [\n    1,\n    2\n  ]\n}"
        );
    }

    #[test]
    fn request_variables_reach_the_template_but_cannot_replace_the_renderers() {
        let template = ChatTemplate::new(SWITCHED)
            .unwrap()
            .with_special_tokens("<bos>".into(), "<eos>".into());
        let messages = [ChatMessage::user("hi")];
        assert_eq!(
            template.render(&messages, true).unwrap(),
            "<bos><user>hi<model><no-thought>"
        );
        let mut thinking = TemplateVariables::new();
        thinking.insert("enable_thinking".into(), true.into());
        assert_eq!(
            template.render_with(&messages, true, &thinking).unwrap(),
            "<bos><user>hi<model>"
        );
        for name in RENDERER_VARIABLES {
            let mut variables = TemplateVariables::new();
            variables.insert(name.into(), 1.into());
            let error = template
                .render_with(&messages, true, &variables)
                .unwrap_err();
            assert!(error.to_string().contains(name), "{error}");
        }
    }
}
