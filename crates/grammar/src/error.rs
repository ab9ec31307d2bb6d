//! Why a requested output format cannot constrain a request, and why a vocabulary cannot
//! back constraints at all.

/// Which part of the requested output format was wrong. The API layer names the request
/// field after it (`response_format.json_schema`, `regex`, ...): this crate does not know
/// how a client spelled the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GrammarErrorKind {
    /// The `json_object` format (any JSON object).
    JsonObject,
    /// A JSON schema.
    Schema,
    /// A regular expression.
    Regex,
    /// A Lark grammar.
    Lark,
}

impl GrammarErrorKind {
    /// A short name of the format, for callers that have no better field name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::JsonObject => "json_object",
            Self::Schema => "json_schema",
            Self::Regex => "regex",
            Self::Lark => "lark",
        }
    }
}

impl std::fmt::Display for GrammarErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A requested output format that does not compile: not JSON, refused by llguidance, or
/// over a size limit. The message is llguidance's own (or ours for the checks done
/// first), meant for the client.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind}: {message}")]
pub struct GrammarError {
    kind: GrammarErrorKind,
    message: String,
}

impl GrammarError {
    pub(crate) fn new(kind: GrammarErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The part of the format that was wrong.
    pub fn kind(&self) -> GrammarErrorKind {
        self.kind
    }

    /// The default field name of [`Self::kind`] (see [`GrammarErrorKind::as_str`]).
    pub fn field(&self) -> &'static str {
        self.kind.as_str()
    }

    /// What was wrong, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// A tokenizer whose vocabulary cannot back grammar constraints. Raised once, when the
/// model loads, never per request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VocabularyError {
    /// The decoder is neither byte-level (GPT-2 style) nor SentencePiece-style, so the
    /// bytes of a token cannot be known from its spelling.
    #[error("unsupported tokenizer decoder for grammar constraints: {0}")]
    UnsupportedDecoder(String),
    /// Grammars need an end-of-sequence id to tell the model when the output is complete.
    #[error("the model has no end-of-sequence id")]
    NoEos,
    /// An end-of-sequence id the model cannot emit.
    #[error("end-of-sequence id {id} is outside the model's vocabulary of {vocab_size}")]
    EosOutOfVocabulary { id: u32, vocab_size: usize },
    /// A vocabulary size the token trie cannot index.
    #[error("unsupported vocabulary size {0}")]
    VocabularySize(usize),
    /// llguidance refused the vocabulary.
    #[error("building the token trie: {0}")]
    Trie(String),
}
