//! The bytes of every token id, as llguidance's token trie needs them.
//!
//! [`Spelling`] undoes the vocabulary's spelling of ordinary tokens; what is llguidance's
//! own is the form of special tokens.

use specd_text::token_bytes::Spelling;
use tokenizers::Tokenizer;

/// llguidance's marker of a special token: 0xFF never occurs in UTF-8 text, so special
/// tokens can never be spelled by ordinary output.
const SPECIAL_TOKEN_MARKER: u8 = 0xff;

/// The bytes of every id below `vocab_size`, in id order: special tokens as the marker and
/// their name (how llguidance tells them from text), ids the tokenizer lacks as nothing (a
/// grammar can never produce them).
pub(crate) fn vocabulary_bytes(
    tokenizer: &Tokenizer,
    spelling: Spelling,
    vocab_size: usize,
) -> Vec<Vec<u8>> {
    let special: std::collections::HashSet<u32> = tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, token)| token.special)
        .map(|(id, _)| id)
        .collect();
    (0..vocab_size)
        .map(|id| {
            let Ok(id) = u32::try_from(id) else {
                return Vec::new();
            };
            match tokenizer.id_to_token(id) {
                Some(name) if special.contains(&id) => {
                    let mut bytes = Vec::with_capacity(name.len() + 1);
                    bytes.push(SPECIAL_TOKEN_MARKER);
                    bytes.extend_from_slice(name.as_bytes());
                    bytes
                }
                Some(name) => spelling.bytes(&name),
                None => Vec::new(),
            }
        })
        .collect()
}
