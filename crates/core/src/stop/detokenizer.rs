//! Turning token ids back into text, as seen by the model-free core.

/// Decodes token ids to text. Implementations wrap a real tokenizer; the core only needs this.
///
/// Decoding a slice that ends inside a multi-byte character must yield U+FFFD for the
/// incomplete bytes (as byte-level tokenizers do), so incremental decoding can wait for the
/// rest of the character.
pub trait Detokenizer: Send + Sync {
    /// The text of `ids`.
    fn decode(&self, ids: &[u32]) -> Result<String, DetokenizeError>;
}

/// The tokenizer could not decode some ids.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot decode tokens: {0}")]
pub struct DetokenizeError(pub String);
