//! Everything about a target's text in one place: prompt text and chat messages to token
//! ids, token ids back to text, and the ids that end a generation or a chat turn.

use std::io::Read;
use std::path::Path;

use specd_core::stop::DetokenizeError;
use specd_core::Detokenizer;
use tokenizers::Tokenizer;

use crate::chat_template::{ChatMessage, ChatTemplate, TemplateVariables};
use crate::checkpoint_files::CheckpointFiles;
use crate::error::{Result, TextError};
use crate::gguf_metadata::read_metadata;
use crate::gguf_tokenizer::GgufTokenizer;
use crate::token_bytes::Spelling;

/// Tokens that close a chat turn in the chat formats of common model families; a chat
/// request stops at whichever of them the vocabulary has.
pub const END_OF_TURN_TOKENS: [&str; 5] = [
    "<|im_end|>",
    "<end_of_turn>",
    "<turn|>",
    "<|eot_id|>",
    "<|end|>",
];

/// The target's tokenizer (optional), chat template (optional) and stop ids.
#[derive(Default)]
pub struct TargetText {
    tokenizer: Option<Tokenizer>,
    template: Option<ChatTemplate>,
    eos_token_ids: Vec<u32>,
    end_of_turn_ids: Vec<u32>,
    /// Leave special tokens (chat-turn markers, end of text) out of decoded text.
    skip_special_tokens: bool,
    /// How the vocabulary spells bytes, read once: [`Self::token_bytes`] needs it per token
    /// of every reply with log probabilities. None without a tokenizer or for a decoder
    /// [`Spelling`] does not know.
    spelling: Option<Spelling>,
}

impl TargetText {
    /// The text side of the target at `path`: a checkpoint directory or a GGUF file.
    pub fn load(path: &Path) -> Result<Self> {
        if path.is_dir() {
            Self::from_dir(path)
        } else if is_gguf(path)? {
            Self::from_gguf(path)
        } else {
            Err(TextError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "neither a checkpoint directory nor a GGUF file",
                ),
            })
        }
    }

    /// Reads `tokenizer.json` (if present), the end-of-sequence ids of `config.json` (top
    /// level, else `text_config`) and `generation_config.json`, and the chat template of
    /// `chat_template.jinja` or `tokenizer_config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let files = CheckpointFiles::read(dir)?;
        let template = match files.chat_template {
            Some(source) => Some(ChatTemplate::new(source)?.with_special_tokens(
                files.bos_token.clone().unwrap_or_default(),
                files.eos_token.clone().unwrap_or_default(),
            )),
            None => None,
        };
        let end_of_turn_ids = match &files.tokenizer {
            Some(tokenizer) => {
                end_of_turn(&files.eos_token_ids, tokenizer, files.eos_token.as_deref())
            }
            None => files.eos_token_ids.clone(),
        };
        Ok(Self {
            spelling: files.tokenizer.as_ref().and_then(spelling),
            tokenizer: files.tokenizer,
            template,
            eos_token_ids: files.eos_token_ids,
            end_of_turn_ids,
            skip_special_tokens: false,
        })
    }

    /// The tokenizer, stop ids and chat template of a GGUF model (`tokenizer.json` beside
    /// the file when present, else rebuilt from the metadata; see
    /// [`ChatTemplate::for_gguf_target`] for the template). Decoded text leaves out special
    /// tokens.
    pub fn from_gguf(path: &Path) -> Result<Self> {
        let metadata = read_metadata(path)?;
        let tokenizer = GgufTokenizer::for_model_with(path, &metadata)?;
        let template = ChatTemplate::for_gguf_target(&metadata)?;
        let eos_token_ids = tokenizer.eos_token_ids().to_vec();
        let tokenizer = tokenizer.into_inner();
        let end_of_turn_ids = end_of_turn(&eos_token_ids, &tokenizer, None);
        Ok(Self {
            spelling: spelling(&tokenizer),
            tokenizer: Some(tokenizer),
            template,
            eos_token_ids,
            end_of_turn_ids,
            skip_special_tokens: true,
        })
    }

    /// A target known only by its end-of-sequence ids (token-id clients only).
    pub fn without_tokenizer(eos_token_ids: Vec<u32>) -> Self {
        Self {
            end_of_turn_ids: eos_token_ids.clone(),
            eos_token_ids,
            ..Self::default()
        }
    }

    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// Ids that end an assistant turn: the end-of-sequence ids and the chat format's turn
    /// terminator.
    pub fn end_of_turn_ids(&self) -> &[u32] {
        &self.end_of_turn_ids
    }

    pub fn has_tokenizer(&self) -> bool {
        self.tokenizer.is_some()
    }

    /// The tokenizer itself, for what needs the vocabulary (grammar constraints).
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    pub fn has_chat_template(&self) -> bool {
        self.template.is_some() && self.tokenizer.is_some()
    }

    /// The id of the token written `token` (added tokens such as `<tool_call>` included);
    /// None without a tokenizer or when the vocabulary has no such token.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.as_ref()?.token_to_id(token)
    }

    /// The bytes token `id` stands for, special tokens as written (`<|im_end|>`); None
    /// without a tokenizer or for an id past the vocabulary. Log probabilities report
    /// tokens one by one, and one token of a byte-level or byte-fallback vocabulary may be
    /// part of a character: decoding it alone gives U+FFFD, so such a token's bytes are read
    /// from its vocabulary entry instead.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let tokenizer = self.tokenizer.as_ref()?;
        let added = tokenizer.get_added_vocabulary().get_added_tokens_decoder();
        if let Some(token) = added.get(&id) {
            return Some(token.content.clone().into_bytes());
        }
        let entry = tokenizer.id_to_token(id)?;
        let decoded = tokenizer.decode(&[id], false).unwrap_or_default();
        if !decoded.contains(char::REPLACEMENT_CHARACTER) {
            return Some(decoded.into_bytes());
        }
        Some(match self.spelling {
            Some(spelling) => spelling.bytes(&entry),
            None => decoded.into_bytes(),
        })
    }

    /// [`Self::token_bytes`] as text, a partial character as U+FFFD.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.token_bytes(id)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Token ids of a text prompt, special tokens added as the tokenizer's post-processor
    /// specifies (a BOS for Gemma; nothing for Qwen).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let tokenizer = self.tokenizer.as_ref().ok_or(TextError::NoTokenizer)?;
        tokenizer
            .encode(text, true)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| TextError::tokenizer("encoding text", e))
    }

    /// The chat template's text for `messages`, opening the assistant's turn.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String> {
        self.template
            .as_ref()
            .ok_or(TextError::NoChatTemplate)?
            .render(messages, true)
    }

    /// Token ids of `messages` as the chat template renders them, ready for the reply. The
    /// template writes every special token itself, so the tokenizer adds none.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.encode_chat_with(messages, &TemplateVariables::new())
    }

    /// [`Self::encode_chat`] with more variables for the template.
    pub fn encode_chat_with(
        &self,
        messages: &[ChatMessage],
        variables: &TemplateVariables,
    ) -> Result<Vec<u32>> {
        let tokenizer = self.tokenizer.as_ref().ok_or(TextError::NoTokenizer)?;
        let text = self
            .template
            .as_ref()
            .ok_or(TextError::NoChatTemplate)?
            .render_with(messages, true, variables)?;
        tokenizer
            .encode(text, false)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| TextError::tokenizer("encoding the chat prompt", e))
    }
}

/// Without a tokenizer every text is empty: token ids still flow.
impl Detokenizer for TargetText {
    fn decode(&self, ids: &[u32]) -> std::result::Result<String, DetokenizeError> {
        match &self.tokenizer {
            Some(tokenizer) => tokenizer
                .decode(ids, self.skip_special_tokens)
                .map_err(|e| DetokenizeError(e.to_string())),
            None => Ok(String::new()),
        }
    }
}

/// The end-of-sequence ids, the token `named` as the end of sequence, and whichever of
/// [`END_OF_TURN_TOKENS`] the vocabulary has, sorted.
fn end_of_turn(eos_token_ids: &[u32], tokenizer: &Tokenizer, named: Option<&str>) -> Vec<u32> {
    let mut ids = eos_token_ids.to_vec();
    ids.extend(
        named
            .into_iter()
            .chain(END_OF_TURN_TOKENS)
            .filter_map(|token| tokenizer.token_to_id(token)),
    );
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The vocabulary's spelling; a decoder it does not know only costs partial characters
/// their exact bytes in [`TargetText::token_bytes`], so it is no error here.
fn spelling(tokenizer: &Tokenizer) -> Option<Spelling> {
    match Spelling::of(tokenizer) {
        Ok(spelling) => Some(spelling),
        Err(e) => {
            tracing::debug!(%e, "a token that is part of a character reads as its decoded text");
            None
        }
    }
}

fn is_gguf(path: &Path) -> Result<bool> {
    let mut magic = [0u8; 4];
    let mut file = std::fs::File::open(path).map_err(|e| TextError::io(path, e))?;
    Ok(file.read_exact(&mut magic).is_ok() && &magic == b"GGUF")
}
