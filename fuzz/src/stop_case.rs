//! One stop-checker run as a byte string: a byte-level vocabulary, stop conditions, prompt
//! context and the tokens to emit.
//!
//! Layout: flags, `max_tokens`, then counted lists (a count byte, then the items): pieces
//! (each a length byte and the bytes), stop strings (the same, read as lossy UTF-8),
//! end-of-sequence ids, stop token ids and context ids (one byte each); every byte after
//! that is one emitted token id.

use specd_core::stop::{DetokenizeError, Detokenizer};

use crate::Reader;

/// Keep generating through end-of-sequence ids.
pub const IGNORE_EOS: u8 = 1;
/// End the run with `finish(Cancelled)` after the last token.
pub const CANCEL_AT_END: u8 = 2;
/// Decode like a SentencePiece tokenizer: the text of a window loses one leading space, so
/// a shorter window's text is not always a prefix of a longer one's.
pub const STRIP_LEADING_SPACE: u8 = 4;

#[derive(Clone, Debug, Default)]
pub struct StopCase {
    pub flags: u8,
    pub max_tokens: u8,
    pub pieces: Vec<Vec<u8>>,
    pub stop_strings: Vec<String>,
    pub eos_ids: Vec<u8>,
    pub stop_ids: Vec<u8>,
    pub context: Vec<u8>,
    pub tokens: Vec<u8>,
}

impl StopCase {
    pub fn parse(data: &[u8]) -> Self {
        let mut r = Reader::new(data);
        let flags = r.u8();
        let max_tokens = r.u8();
        let pieces = counted(&mut r, |r| {
            let len = usize::from(r.u8());
            r.bytes(len).to_vec()
        });
        let stop_strings = counted(&mut r, |r| {
            let len = usize::from(r.u8());
            String::from_utf8_lossy(r.bytes(len)).into_owned()
        });
        let eos_ids = counted(&mut r, Reader::u8);
        let stop_ids = counted(&mut r, Reader::u8);
        let context = counted(&mut r, Reader::u8);
        let tokens = r.rest().to_vec();
        Self {
            flags,
            max_tokens,
            pieces,
            stop_strings,
            eos_ids,
            stop_ids,
            context,
            tokens,
        }
    }

    /// The input that [`StopCase::parse`] reads back as `self` (lists are cut to 255 items,
    /// pieces and stop strings to 255 bytes).
    pub fn encode(&self) -> Vec<u8> {
        fn list<T>(out: &mut Vec<u8>, items: &[T], mut item: impl FnMut(&mut Vec<u8>, &T)) {
            let n = items.len().min(255);
            out.push(n as u8);
            for it in &items[..n] {
                item(out, it);
            }
        }
        fn blob(out: &mut Vec<u8>, bytes: &[u8]) {
            let n = bytes.len().min(255);
            out.push(n as u8);
            out.extend_from_slice(&bytes[..n]);
        }
        let mut out = vec![self.flags, self.max_tokens];
        list(&mut out, &self.pieces, |o, p| blob(o, p));
        list(&mut out, &self.stop_strings, |o, s| blob(o, s.as_bytes()));
        list(&mut out, &self.eos_ids, |o, &id| o.push(id));
        list(&mut out, &self.stop_ids, |o, &id| o.push(id));
        list(&mut out, &self.context, |o, &id| o.push(id));
        out.extend_from_slice(&self.tokens);
        out
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    pub fn detokenizer(&self) -> PieceDetokenizer {
        PieceDetokenizer {
            pieces: self.pieces.clone(),
            strip_leading_space: self.has(STRIP_LEADING_SPACE),
        }
    }
}

fn counted<'a, T>(r: &mut Reader<'a>, mut item: impl FnMut(&mut Reader<'a>) -> T) -> Vec<T> {
    let n = r.u8();
    (0..n).map(|_| item(r)).collect()
}

/// Decodes by concatenating piece bytes; invalid UTF-8 becomes U+FFFD, as byte-level BPE
/// tokenizers do, and ids past the vocabulary are an error.
pub struct PieceDetokenizer {
    pub pieces: Vec<Vec<u8>>,
    pub strip_leading_space: bool,
}

impl PieceDetokenizer {
    /// The bytes of `ids`, or the first id outside the vocabulary.
    pub fn bytes(&self, ids: &[u32]) -> Result<Vec<u8>, u32> {
        let mut bytes = Vec::new();
        for &id in ids {
            let piece = self.pieces.get(id as usize).ok_or(id)?;
            bytes.extend_from_slice(piece);
        }
        Ok(bytes)
    }
}

impl Detokenizer for PieceDetokenizer {
    fn decode(&self, ids: &[u32]) -> Result<String, DetokenizeError> {
        let bytes = self
            .bytes(ids)
            .map_err(|id| DetokenizeError(format!("id {id} is outside the vocabulary")))?;
        let text = String::from_utf8_lossy(&bytes);
        let text = match self.strip_leading_space {
            true => text.strip_prefix(' ').unwrap_or(&text),
            false => &text,
        };
        Ok(text.to_owned())
    }
}
