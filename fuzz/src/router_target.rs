//! A small target for the router's request validation: limits, and a text side with a
//! word-level tokenizer and a chat template, so that text prompts and chat messages get past
//! the "no tokenizer" checks into tokenization and template rendering.

use std::path::Path;

use specd_router::{TargetLimits, TargetText};
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::whitespace::WhitespaceSplit;
use tokenizers::Tokenizer;

/// Vocabulary size: words `w0` .. `w254` are ids 0 .. 254, `<|im_end|>` is 255.
pub const VOCAB: u32 = 256;
/// End of sequence (`config.json`).
pub const EOS: u32 = 1;
/// End of a chat turn.
pub const END_OF_TURN: u32 = 255;

/// Small, so that prompts and `max_tokens` run into the context limit.
pub fn limits() -> TargetLimits {
    TargetLimits {
        vocab_size: VOCAB as usize,
        max_context_tokens: 64,
        max_block_size: 8,
        model: "fuzz".to_owned(),
        verifies_trees: false,
    }
}

const CHAT_TEMPLATE: &str = "{% for m in messages %}<|im_start|> {{ m.role }} {{ m.content }} \
<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}";

/// The text side with a tokenizer and chat template, built through the same loader the
/// router uses for a checkpoint directory.
pub fn text_with_tokenizer() -> TargetText {
    let dir = std::env::temp_dir().join(format!("specd-fuzz-router-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    write_checkpoint(&dir);
    let text = TargetText::from_dir(&dir).expect("fuzz checkpoint loads");
    let _ = std::fs::remove_dir_all(&dir);
    text
}

/// The text side of a target known only by its ids.
pub fn text_without_tokenizer() -> TargetText {
    TargetText::without_tokenizer(vec![EOS])
}

fn write_checkpoint(dir: &Path) {
    std::fs::write(
        dir.join("config.json"),
        format!("{{\"eos_token_id\": {EOS}}}"),
    )
    .expect("config.json");
    std::fs::write(dir.join("chat_template.jinja"), CHAT_TEMPLATE).expect("chat template");
    let mut vocab: std::collections::HashMap<String, u32> =
        (0..END_OF_TURN).map(|i| (format!("w{i}"), i)).collect();
    vocab.insert("<|im_end|>".to_owned(), END_OF_TURN);
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("w0".to_owned())
        .build()
        .expect("word-level model");
    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(WhitespaceSplit));
    tokenizer
        .save(dir.join("tokenizer.json"), false)
        .expect("tokenizer.json");
}
