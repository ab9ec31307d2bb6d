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
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A template with a switch as Gemma 4's `enable_thinking`.
    const SWITCHED: &str = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}\
        {% endfor %}{% if add_generation_prompt %}<model>{% if not enable_thinking %}<no-thought>\
        {% endif %}{% endif %}";

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
