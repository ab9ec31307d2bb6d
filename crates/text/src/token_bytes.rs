//! The bytes a vocabulary entry stands for.
//!
//! A tokenizer stores tokens as spellings, not bytes: byte-level BPE (GPT-2, Qwen2) spells
//! every byte as a printable char, SentencePiece-style vocabularies (Gemma) spell a space as
//! `▁` and bytes without a token of their own as `<0xAB>`. Grammars work on the bytes of the
//! output, and log probabilities report tokens one by one, some of them part of a
//! character: both need a token's bytes on its own, so the spelling is undone here, the
//! same way the tokenizer's own decoder undoes it, token by token.

use serde_json::Value;
use tokenizers::Tokenizer;

/// How a vocabulary spells bytes, read off the tokenizer's decoder (the part that turns
/// spellings back into text, so the one that knows the mapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spelling {
    /// GPT-2's bytes-to-unicode table: every byte is one char.
    ByteLevel,
    /// Text as UTF-8 with `space` standing for ' ', and `<0xAB>` tokens for raw bytes when
    /// the decoder has a byte fallback.
    SentencePiece { space: char, byte_fallback: bool },
}

/// A decoder whose spelling of bytes is neither of [`Spelling`]'s, so the bytes of a token
/// cannot be known from its vocabulary entry; the message says which decoder.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unsupported tokenizer decoder: {0}")]
pub struct UnsupportedDecoder(pub String);

impl Spelling {
    /// The spelling of `tokenizer`'s vocabulary, or which decoder spells bytes some other
    /// way (WordPiece), whose tokens' bytes cannot be known one by one.
    pub fn of(tokenizer: &Tokenizer) -> Result<Self, UnsupportedDecoder> {
        let decoder = tokenizer
            .get_decoder()
            .ok_or_else(|| UnsupportedDecoder("no decoder".to_string()))?;
        // The wrappers keep their settings private; their serialized form is the
        // tokenizer.json schema, which is public and stable.
        let decoder =
            serde_json::to_value(decoder).map_err(|e| UnsupportedDecoder(e.to_string()))?;
        Self::of_decoder(&decoder)
    }

    fn of_decoder(decoder: &Value) -> Result<Self, UnsupportedDecoder> {
        let parts: Vec<&Value> = match decoder.get("decoders").and_then(Value::as_array) {
            Some(parts) => parts.iter().collect(),
            None => vec![decoder],
        };
        let kind = |part: &Value| part.get("type").and_then(Value::as_str).map(str::to_owned);
        if parts
            .iter()
            .any(|p| kind(p).as_deref() == Some("ByteLevel"))
        {
            return Ok(Self::ByteLevel);
        }
        let mut space = None;
        let mut byte_fallback = false;
        for part in &parts {
            match kind(part).as_deref() {
                Some("ByteFallback") => byte_fallback = true,
                Some("Metaspace") => {
                    space = part
                        .get("replacement")
                        .and_then(Value::as_str)
                        .and_then(single_char)
                        .or(space);
                }
                Some("Replace") if part.get("content").and_then(Value::as_str) == Some(" ") => {
                    space = part
                        .get("pattern")
                        .and_then(|p| p.get("String"))
                        .and_then(Value::as_str)
                        .and_then(single_char)
                        .or(space);
                }
                _ => {}
            }
        }
        match space {
            Some(space) => Ok(Self::SentencePiece {
                space,
                byte_fallback,
            }),
            None if byte_fallback => Ok(Self::SentencePiece {
                space: ' ',
                byte_fallback,
            }),
            None => Err(UnsupportedDecoder(decoder.to_string())),
        }
    }

    /// The bytes of an ordinary (not special) token spelled `spelling`, exact even where
    /// they are only part of a character. Special tokens are text as written, which each
    /// caller marks its own way.
    pub fn bytes(self, spelling: &str) -> Vec<u8> {
        match self {
            Self::ByteLevel => byte_level_bytes(spelling),
            Self::SentencePiece {
                space,
                byte_fallback,
            } => {
                if byte_fallback {
                    if let Some(byte) = fallback_byte(spelling) {
                        return vec![byte];
                    }
                }
                spelling.replace(space, " ").into_bytes()
            }
        }
    }
}

fn single_char(s: &str) -> Option<char> {
    let mut chars = s.chars();
    let c = chars.next()?;
    chars.next().is_none().then_some(c)
}

/// `<0xAB>` as the byte 0xAB.
fn fallback_byte(spelling: &str) -> Option<u8> {
    let hex = spelling.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// A byte-level spelling as bytes. Like the tokenizer's ByteLevel decoder, a spelling with
/// a char outside the table (an added token written as plain text) is taken as UTF-8 whole.
fn byte_level_bytes(spelling: &str) -> Vec<u8> {
    spelling
        .chars()
        .map(byte_of_char)
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| spelling.as_bytes().to_vec())
}

/// The inverse of GPT-2's bytes-to-unicode table. The table keeps the printable bytes
/// `!`..=`~`, `¡`..=`¬` and `®`..=`ÿ` as their own code points and gives the other 68
/// bytes (controls, space, DEL, NBSP, soft hyphen) the code points from U+0100 up, in byte
/// order.
fn byte_of_char(c: char) -> Option<u8> {
    let slot = *CHAR_TO_BYTE.get(usize::try_from(u32::from(c)).ok()?)?;
    slot.checked_sub(1).and_then(|b| u8::try_from(b).ok())
}

/// The code points the table uses: 0..0x100 and the 68 past it.
const TABLE_CHARS: usize = 0x100 + 68;

/// Byte + 1 at the index of its char, 0 where no byte maps (a lookup per char of a
/// ~150k-token vocabulary has to be cheap).
const CHAR_TO_BYTE: [u16; TABLE_CHARS] = {
    let mut table = [0u16; TABLE_CHARS];
    let mut next_unprintable = 0x100;
    let mut byte = 0;
    while byte < 256 {
        if is_printable_byte(byte as u32) {
            table[byte] = byte as u16 + 1;
        } else {
            table[next_unprintable] = byte as u16 + 1;
            next_unprintable += 1;
        }
        byte += 1;
    }
    table
};

const fn is_printable_byte(code: u32) -> bool {
    matches!(code, 0x21..=0x7e | 0xa1..=0xac | 0xae..=0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_level_table_is_a_bijection_on_bytes() {
        // Space is the 33rd unprintable byte (0x00..=0x20), so `Ġ` (U+0120 = 0x100 + 32).
        assert_eq!(byte_of_char('Ġ'), Some(b' '));
        assert_eq!(byte_of_char('Ċ'), Some(b'\n'));
        assert_eq!(byte_of_char('A'), Some(b'A'));
        assert_eq!(byte_of_char(' '), None);
        let chars: std::collections::HashSet<u8> = (0x21..0x200u32)
            .filter_map(char::from_u32)
            .filter_map(byte_of_char)
            .collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(byte_level_bytes("ĠhÃ©"), " hé".as_bytes());
        assert_eq!(byte_level_bytes("<|im end|>"), b"<|im end|>");
    }

    #[test]
    fn byte_level_characters_map_back_to_their_bytes() {
        // GPT-2's map: "Ā" is the NUL, "ġ" the DEL, "ł" the NBSP, "Ń" the soft hyphen;
        // "ðŁ" the first two bytes of an emoji.
        assert_eq!(byte_level_bytes("Ġhi"), b" hi");
        assert_eq!(byte_level_bytes("Āġł"), [0x00, 0x7F, 0xA0]);
        assert_eq!(byte_level_bytes("Ń"), [0xAD]);
        assert_eq!(byte_level_bytes("ðŁ"), [0xF0, 0x9F]);
        assert_eq!(byte_level_bytes("\u{FFFD}"), "\u{FFFD}".as_bytes());
    }

    #[test]
    fn byte_fallback_tokens_are_one_byte() {
        assert_eq!(fallback_byte("<0xE2>"), Some(0xE2));
        assert_eq!(fallback_byte("<0x0A>"), Some(b'\n'));
        assert_eq!(fallback_byte("<0xE>"), None);
        assert_eq!(fallback_byte("<eos>"), None);
    }

    #[test]
    fn sentencepiece_spellings() {
        let sp = Spelling::SentencePiece {
            space: '▁',
            byte_fallback: true,
        };
        assert_eq!(sp.bytes("▁name"), b" name");
        assert_eq!(sp.bytes("<0x0A>"), b"\n");
        assert_eq!(sp.bytes("<0xE2>"), [0xe2]);
        assert_eq!(sp.bytes("<0x0>"), b"<0x0>");
    }

    #[test]
    fn decoders_are_recognized() {
        let byte_level = serde_json::json!({"type": "ByteLevel"});
        assert_eq!(Spelling::of_decoder(&byte_level), Ok(Spelling::ByteLevel));
        let gemma = serde_json::json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]});
        assert_eq!(
            Spelling::of_decoder(&gemma),
            Ok(Spelling::SentencePiece {
                space: '▁',
                byte_fallback: true
            })
        );
        let metaspace = serde_json::json!({"type": "Metaspace", "replacement": "▁"});
        assert_eq!(
            Spelling::of_decoder(&metaspace),
            Ok(Spelling::SentencePiece {
                space: '▁',
                byte_fallback: false
            })
        );
        assert!(Spelling::of_decoder(&serde_json::json!({"type": "WordPiece"})).is_err());
    }
}
