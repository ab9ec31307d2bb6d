//! One token's bytes and text, as log probabilities report them: whole characters, the bytes
//! of a partial character (byte-level BPE and byte fallback alike), and special tokens as
//! written even where decoded text leaves them out.

use std::path::{Path, PathBuf};

use serde_json::json;
use specd_text::TargetText;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

/// GPT-2's printable character of every byte.
fn byte_chars() -> Vec<char> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                char::from(b)
            } else {
                let c = char::from_u32(next).unwrap();
                next += 1;
                c
            }
        })
        .collect()
}

/// A checkpoint directory with a byte-level BPE: one token per byte (id = byte), "Ġh" and
/// "Ġhi" as 256 and 257, and `<|im_end|>` as a special token 258.
fn byte_level_checkpoint() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("specd-token-bytes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        json!({"eos_token_id": 258}).to_string(),
    )
    .unwrap();
    let chars = byte_chars();
    let mut vocab: Vec<(String, u32)> = chars
        .iter()
        .enumerate()
        .map(|(b, c)| (c.to_string(), b as u32))
        .collect();
    vocab.push(("Ġh".into(), 256));
    vocab.push(("Ġhi".into(), 257));
    let model = BPE::builder()
        .vocab_and_merges(
            vocab
                .into_iter()
                .collect::<tokenizers::models::bpe::Vocab>(),
            vec![("Ġ".into(), "h".into()), ("Ġh".into(), "i".into())],
        )
        .build()
        .unwrap();
    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, false, false)));
    tokenizer.with_decoder(Some(ByteLevelDecoder::new(false, false, false)));
    tokenizer.add_special_tokens(&[AddedToken::from("<|im_end|>", true)]);
    tokenizer.save(dir.join("tokenizer.json"), false).unwrap();
    dir
}

#[test]
fn byte_level_tokens_give_their_bytes_even_mid_character() {
    let dir = byte_level_checkpoint();
    let text = TargetText::from_dir(&dir).unwrap();
    assert_eq!(text.encode(" hi").unwrap(), [257]);
    assert_eq!(text.token_bytes(257), Some(b" hi".to_vec()));
    assert_eq!(text.token_text(257).as_deref(), Some(" hi"));
    // 🚀 is F0 9F 9A 80: each byte alone is no character.
    assert_eq!(text.token_bytes(0xF0), Some(vec![0xF0]));
    assert_eq!(text.token_text(0xF0).as_deref(), Some("\u{FFFD}"));
    assert_eq!(text.token_bytes(u32::from(b'\n')), Some(b"\n".to_vec()));
    assert_eq!(text.token_bytes(258), Some(b"<|im_end|>".to_vec()));
    assert_eq!(text.token_id("<|im_end|>"), Some(258));
    assert_eq!(text.token_id("<tool_call>"), None);
    assert_eq!(text.token_bytes(259), None);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn byte_fallback_tokens_give_their_byte_and_control_tokens_their_text() {
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma4-tokenizer.gguf");
    let text = TargetText::load(&gguf).unwrap();
    let id = |token: &str| text.token_id(token).unwrap();
    assert_eq!(text.token_bytes(id("<0xF0>")), Some(vec![0xF0]));
    assert_eq!(text.token_bytes(id("<0x0A>")), Some(b"\n".to_vec()));
    // Decoded text skips control tokens; a token's own text does not.
    assert_eq!(text.token_text(id("<turn|>")).as_deref(), Some("<turn|>"));
    assert_eq!(
        text.token_text(id("<|tool_call>")).as_deref(),
        Some("<|tool_call>")
    );
    let ids = text.encode("Hello there, 🚀!").unwrap();
    let bytes: Vec<u8> = ids[1..]
        .iter()
        .flat_map(|&id| text.token_bytes(id).unwrap())
        .collect();
    assert_eq!(String::from_utf8(bytes).unwrap(), "Hello there, 🚀!");
    assert!(TargetText::without_tokenizer(vec![1])
        .token_bytes(1)
        .is_none());
}
