//! A byte-level vocabulary for the stop tests: each id is a byte sequence, and decoding
//! concatenates the bytes and replaces invalid UTF-8 with U+FFFD, as byte-level BPE
//! tokenizers do (so pieces can split a character).

use super::{DetokenizeError, Detokenizer};

pub(super) struct Pieces(pub Vec<Vec<u8>>);

impl Detokenizer for Pieces {
    fn decode(&self, ids: &[u32]) -> Result<String, DetokenizeError> {
        let mut bytes = Vec::new();
        for &id in ids {
            let piece = self
                .0
                .get(id as usize)
                .ok_or_else(|| DetokenizeError(format!("unknown id {id}")))?;
            bytes.extend_from_slice(piece);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}
