//! Incremental detokenization that never splits a character.

use super::detokenizer::{DetokenizeError, Detokenizer};

/// Turns a growing token sequence into text deltas.
///
/// Each step decodes a short window twice, `ids[prefix..read]` and `ids[prefix..]`, and emits
/// the difference, so tokenizers whose output for a token depends on its neighbours (leading
/// spaces, byte fallback) still produce the right text. A step whose text ends in U+FFFD is
/// held until the character completes.
#[derive(Clone, Debug)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl IncrementalDecoder {
    /// Starts after `context` (for example the last few prompt tokens), whose text is not
    /// emitted but shapes the first delta.
    pub fn new(context: &[u32]) -> Self {
        Self {
            ids: context.to_vec(),
            prefix_offset: 0,
            read_offset: context.len(),
        }
    }

    /// Adds `token` and returns the text it completes (possibly empty).
    pub fn push<T: Detokenizer + ?Sized>(
        &mut self,
        token: u32,
        detokenizer: &T,
    ) -> Result<String, DetokenizeError> {
        self.ids.push(token);
        self.advance(detokenizer, false)
    }

    /// Returns whatever text is still held back (an incomplete character decodes as U+FFFD).
    pub fn flush<T: Detokenizer + ?Sized>(
        &mut self,
        detokenizer: &T,
    ) -> Result<String, DetokenizeError> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        self.advance(detokenizer, true)
    }

    fn advance<T: Detokenizer + ?Sized>(
        &mut self,
        detokenizer: &T,
        force: bool,
    ) -> Result<String, DetokenizeError> {
        let prefix = detokenizer.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = detokenizer.decode(&self.ids[self.prefix_offset..])?;
        if !force && (full.len() <= prefix.len() || full.ends_with('\u{FFFD}')) {
            return Ok(String::new());
        }
        let delta = text_after(&full, &prefix).to_owned();
        // The new window starts where this one was read up to; older ids are never decoded
        // again.
        let keep_from = self.read_offset;
        self.ids.drain(..keep_from);
        self.prefix_offset = 0;
        self.read_offset = self.ids.len();
        Ok(delta)
    }
}

/// The part of `full` after `prefix`. When a tokenizer decodes the shorter window differently
/// (it is not a prefix), cut at the first character boundary past its length instead.
fn text_after<'a>(full: &'a str, prefix: &str) -> &'a str {
    if let Some(rest) = full.strip_prefix(prefix) {
        return rest;
    }
    let mut cut = prefix.len().min(full.len());
    while !full.is_char_boundary(cut) {
        cut += 1;
    }
    &full[cut..]
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::stop::test_pieces::Pieces as Bytes;

    fn vocab() -> Bytes {
        let e_acute = "é".as_bytes();
        let crab = "🦀".as_bytes();
        Bytes(vec![
            b"Hello".to_vec(),
            b" world".to_vec(),
            e_acute[..1].to_vec(),
            e_acute[1..].to_vec(),
            crab[..2].to_vec(),
            crab[2..3].to_vec(),
            crab[3..].to_vec(),
        ])
    }

    #[test]
    fn whole_tokens_come_out_at_once() {
        let v = vocab();
        let mut d = IncrementalDecoder::new(&[]);
        assert_eq!(d.push(0, &v).unwrap(), "Hello");
        assert_eq!(d.push(1, &v).unwrap(), " world");
    }

    #[test]
    fn split_characters_wait_for_their_last_byte() {
        let v = vocab();
        let mut d = IncrementalDecoder::new(&[]);
        assert_eq!(d.push(2, &v).unwrap(), "");
        assert_eq!(d.push(3, &v).unwrap(), "é");
        assert_eq!(d.push(4, &v).unwrap(), "");
        assert_eq!(d.push(5, &v).unwrap(), "");
        assert_eq!(d.push(6, &v).unwrap(), "🦀");
        assert_eq!(d.push(1, &v).unwrap(), " world");
    }

    #[test]
    fn context_is_not_emitted() {
        let v = vocab();
        let mut d = IncrementalDecoder::new(&[0]);
        assert_eq!(d.push(1, &v).unwrap(), " world");
    }

    #[test]
    fn flush_releases_an_incomplete_character() {
        let v = vocab();
        let mut d = IncrementalDecoder::new(&[]);
        assert_eq!(d.push(4, &v).unwrap(), "");
        assert_eq!(d.flush(&v).unwrap(), "\u{FFFD}");
        assert_eq!(d.flush(&v).unwrap(), "");
    }

    #[test]
    fn decode_errors_propagate() {
        let v = vocab();
        let mut d = IncrementalDecoder::new(&[]);
        assert!(d.push(99, &v).is_err());
    }

    #[test]
    fn text_after_handles_non_prefix_windows() {
        assert_eq!(text_after("abc", "ab"), "c");
        assert_eq!(text_after("xé!", "ab"), "!");
    }
}
