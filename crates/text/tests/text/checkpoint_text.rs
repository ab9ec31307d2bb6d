//! A Hugging Face checkpoint directory's text side: tokenizer.json, end-of-sequence ids from
//! config.json and generation_config.json, the chat template from chat_template.jinja or
//! tokenizer_config.json (a string or named templates) with its special tokens.

use std::path::PathBuf;

use serde_json::json;
use specd_core::Detokenizer;
use specd_text::{ChatMessage, TargetText, TextError};
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::whitespace::WhitespaceSplit;
use tokenizers::Tokenizer;

/// A directory with config.json (eos 1) and a word-level tokenizer: word `w{i}` is token `i`,
/// `<eot>` is token 9.
fn checkpoint(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("specd-text-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        json!({"eos_token_id": 1}).to_string(),
    )
    .unwrap();
    let mut vocab: Vec<(String, u32)> = (0..9u32).map(|i| (format!("w{i}"), i)).collect();
    vocab.push(("<eot>".into(), 9));
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("w0".into())
        .build()
        .unwrap();
    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(WhitespaceSplit));
    tokenizer.save(dir.join("tokenizer.json"), false).unwrap();
    dir
}

const TEMPLATE: &str =
    "{{ bos_token }} {% for m in messages %}{{ m.content }} {{ eos_token }} {% endfor %}{% if add_generation_prompt %}w8{% endif %}";

#[test]
fn tokenizer_config_template_and_special_tokens() {
    let dir = checkpoint("config-template");
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({
            "bos_token": {"content": "w2", "lstrip": false},
            "eos_token": "<eot>",
            "chat_template": TEMPLATE,
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        json!({"eos_token_id": [1, 5]}).to_string(),
    )
    .unwrap();
    let text = TargetText::from_dir(&dir).unwrap();
    assert_eq!(text.eos_token_ids(), [1, 5]);
    // The template's end of turn joins the end-of-sequence ids for chat requests.
    assert_eq!(text.end_of_turn_ids(), [1, 5, 9]);
    let messages = [ChatMessage::user("w3 w4")];
    assert_eq!(text.render_chat(&messages).unwrap(), "w2 w3 w4 <eot> w8");
    assert_eq!(text.encode_chat(&messages).unwrap(), [2, 3, 4, 9, 8]);
    assert_eq!(text.decode(&[3, 4]).unwrap(), "w3 w4");
}

#[test]
fn chat_template_jinja_wins_and_named_templates_pick_default() {
    let dir = checkpoint("jinja-template");
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({"chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{% for m in messages %}{{ m.content }}{% endfor %}"},
        ]})
        .to_string(),
    )
    .unwrap();
    let text = TargetText::from_dir(&dir).unwrap();
    assert_eq!(text.render_chat(&[ChatMessage::user("w3")]).unwrap(), "w3");
    std::fs::write(
        dir.join("chat_template.jinja"),
        "w7 {{ messages[0].content }}",
    )
    .unwrap();
    let text = TargetText::from_dir(&dir).unwrap();
    assert_eq!(
        text.render_chat(&[ChatMessage::user("w3")]).unwrap(),
        "w7 w3"
    );
}

#[test]
fn what_a_checkpoint_lacks_is_a_clear_error() {
    let dir = checkpoint("no-template");
    let text = TargetText::from_dir(&dir).unwrap();
    assert!(!text.has_chat_template());
    let err = text.render_chat(&[ChatMessage::user("w3")]).unwrap_err();
    assert!(matches!(err, TextError::NoChatTemplate), "{err}");

    std::fs::write(dir.join("tokenizer_config.json"), "{\"chat_template\": 3}").unwrap();
    let err = TargetText::from_dir(&dir).err().unwrap();
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");
    assert!(err.to_string().contains("chat_template"), "{err}");

    std::fs::write(dir.join("tokenizer_config.json"), "{}").unwrap();
    std::fs::write(dir.join("chat_template.jinja"), "{% if %}").unwrap();
    assert!(matches!(
        TargetText::from_dir(&dir),
        Err(TextError::Template(_))
    ));

    let empty = std::env::temp_dir().join(format!("specd-text-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let err = TargetText::from_dir(&empty).err().unwrap();
    assert!(err.to_string().contains("config.json"), "{err}");
    assert!(TargetText::without_tokenizer(vec![1]).encode("w1").is_err());
}
