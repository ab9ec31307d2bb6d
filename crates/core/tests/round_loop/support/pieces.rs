//! A byte-level detokenizer over the table target's vocabulary.

use specd_core::stop::{DetokenizeError, Detokenizer};

/// Text pieces of ids `0..24`; ids 18 and 19 are the two bytes of "é".
pub const PIECES: [&[u8]; 24] = [
    b"<eos>", b" ", b"a", b"b", b"c", b"d", b"e", b"ab", b"cd", b"the", b" cat", b"ing", b"s",
    b".", b"x", b"y", b"z", b"qu", b"\xC3", b"\xA9", b"!", b"?", b"-", b"ok",
];

/// Decodes by concatenating piece bytes; invalid UTF-8 becomes U+FFFD, as byte-level BPE
/// tokenizers do.
pub struct Pieces;

impl Detokenizer for Pieces {
    fn decode(&self, ids: &[u32]) -> Result<String, DetokenizeError> {
        let mut bytes = Vec::new();
        for &id in ids {
            let piece = PIECES
                .get(id as usize)
                .ok_or_else(|| DetokenizeError(format!("id {id} is outside the vocabulary")))?;
            bytes.extend_from_slice(piece);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Whole-sequence decode, for expectations.
pub fn decode(ids: &[u32]) -> String {
    Pieces.decode(ids).unwrap()
}
