//! The `gemma4` GGUF tokenizer against llama.cpp: the committed Gemma 4-style fixture
//! (tools/gemma4_tokenizer_fixture.py: a GGUF written by llama.cpp's converter and the encodings
//! of llama-tokenize, which Hugging Face tokenizers agrees with), and Gemma 4's real vocabulary
//! with llama.cpp's own tokenizer test cases when llama.cpp's source tree is on this machine.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use serde_json::Value as Json;
use specd_core::Detokenizer;
use specd_text::{ChatMessage, GgufTokenizer, TargetText, TextError};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn fixture_gguf() -> PathBuf {
    fixtures().join("gemma4-tokenizer.gguf")
}

fn references() -> Json {
    let text = std::fs::read_to_string(fixtures().join("gemma4-tokenizer.references.json"))
        .expect("the references of tools/gemma4_tokenizer_fixture.py");
    serde_json::from_str(&text).unwrap()
}

fn ids(value: &Json) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_u64().unwrap() as u32)
        .collect()
}

/// (text, ids with the BOS) of every reference encoding.
fn encodings() -> Vec<(String, Vec<u32>)> {
    references()["encodings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["text"].as_str().unwrap().to_string(), ids(&e["ids"])))
        .collect()
}

fn metadata() -> HashMap<String, Value> {
    specd_text::read_metadata(&fixture_gguf()).unwrap()
}

#[test]
fn encodes_as_llama_cpp_and_decodes_back() {
    let text = TargetText::load(&fixture_gguf()).unwrap();
    let tok = GgufTokenizer::from_gguf_metadata(&metadata()).unwrap();
    let cases = encodings();
    assert!(cases.len() >= 20);
    for (input, expected) in &cases {
        // The prompt path: BOS first, special tokens written in the text as their ids.
        assert_eq!(&text.encode(input).unwrap(), expected, "{input:?}");
        assert_eq!(expected[0], 2, "{input:?}");
        assert_eq!(&tok.encode(input).unwrap(), &expected[1..], "{input:?}");
        assert_eq!(tok.decode(&expected[1..], false).unwrap(), *input);
    }
}

#[test]
fn decoding_joins_byte_fallback_and_restores_spaces() {
    let tok = GgufTokenizer::from_gguf_metadata(&metadata()).unwrap();
    // Characters outside the vocabulary become the bytes of their UTF-8 encoding.
    let rocket = tok.encode("🚀").unwrap();
    let bytes: Vec<String> = "🚀".bytes().map(|b| format!("<0x{b:02X}>")).collect();
    let pieces: Vec<String> = rocket
        .iter()
        .map(|&id| tok.id_to_token(id).unwrap())
        .collect();
    assert_eq!(pieces, bytes);
    assert_eq!(tok.decode(&rocket, false).unwrap(), "🚀");
    // A space belongs to the token after it, as U+2581, and comes back as a space.
    let ids = tok.encode("a  b").unwrap();
    assert!(tok.id_to_token(ids[1]).unwrap().starts_with('\u{2581}'));
    assert_eq!(tok.decode(&ids, false).unwrap(), "a  b");
    // Half a character decodes to U+FFFD, never an error: a stream may stop mid-character.
    assert_eq!(tok.decode(&rocket[..2], false).unwrap(), "\u{FFFD}\u{FFFD}");
}

#[test]
fn control_tokens_are_skipped_in_text_and_markers_kept() {
    let text = TargetText::load(&fixture_gguf()).unwrap();
    let tok = GgufTokenizer::from_gguf_metadata(&metadata()).unwrap();
    let id = |t: &str| tok.token_to_id(t).unwrap();
    let mut ids = vec![id("<bos>"), id("<|turn>")];
    ids.extend(tok.encode("model\nHi").unwrap());
    ids.extend([id("<|tool_call>"), id("<turn|>"), id("<eos>")]);
    // Control tokens leave the streamed text; the tool-call marker is user-defined (the
    // converter keeps it visible so that a tool-call parser can read it).
    assert_eq!(text.decode(&ids).unwrap(), "model\nHi<|tool_call>");
    assert_eq!(
        tok.decode(&ids, false).unwrap(),
        "<bos><|turn>model\nHi<|tool_call><turn|><eos>"
    );
}

#[test]
fn stops_where_llama_cpp_ends_a_gemma4_generation() {
    let text = TargetText::load(&fixture_gguf()).unwrap();
    let tok = GgufTokenizer::from_gguf_metadata(&metadata()).unwrap();
    let id = |t: &str| tok.token_to_id(t).unwrap();
    let mut stops = vec![id("<eos>"), id("<turn|>"), id("<|tool_response>")];
    stops.sort_unstable();
    assert_eq!(tok.eos_token_ids(), stops.as_slice());
    assert_eq!(text.eos_token_ids(), stops.as_slice());
    assert_eq!(text.end_of_turn_ids(), stops.as_slice());
    assert!(!tok.is_eos(id("<|turn>")) && !tok.is_eos(id("<bos>")));
}

#[test]
fn chat_messages_render_through_the_files_template() {
    let text = TargetText::load(&fixture_gguf()).unwrap();
    assert!(text.has_chat_template());
    let chats = references()["chats"].as_array().unwrap().clone();
    assert!(!chats.is_empty());
    for chat in chats {
        let messages: Vec<ChatMessage> = chat["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let rendered = chat["rendered"].as_str().unwrap();
        // {{ bos_token }} is the file's BOS, and encoding adds no second one.
        assert!(rendered.starts_with("<bos><|turn>"));
        assert_eq!(text.render_chat(&messages).unwrap(), rendered);
        assert_eq!(text.encode_chat(&messages).unwrap(), ids(&chat["ids"]));
    }
}

#[test]
fn the_tokenizer_json_it_was_converted_from_encodes_the_same() {
    let json = GgufTokenizer::from_tokenizer_json(
        &fixtures().join("gemma4-tokenizer.hf.json"),
        &metadata(),
    )
    .unwrap();
    let tok = GgufTokenizer::from_gguf_metadata(&metadata()).unwrap();
    assert_eq!(json.eos_token_ids(), tok.eos_token_ids());
    for (input, expected) in encodings() {
        let from_json = json.inner().encode(input.as_str(), true).unwrap();
        assert_eq!(from_json.get_ids(), expected.as_slice(), "{input:?}");
    }
}

#[test]
fn a_file_without_a_template_has_no_chat_and_broken_metadata_is_named() {
    let dir = std::env::temp_dir().join(format!("specd-text-gemma4-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, meta: &HashMap<String, Value>| {
        let path = dir.join(name);
        let refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
        candle_core::quantized::gguf_file::write(
            &mut std::fs::File::create(&path).unwrap(),
            &refs,
            &[],
        )
        .unwrap();
        path
    };

    // No template: text prompts still work, chat requests are refused (the Qwen 2.5 template
    // that byte-level BPE files fall back to would be wrong for Gemma 4).
    let mut meta = metadata();
    meta.remove("tokenizer.chat_template");
    let text = TargetText::load(&write("no-template.gguf", &meta)).unwrap();
    assert!(text.has_tokenizer() && !text.has_chat_template());
    let err = text.render_chat(&[ChatMessage::user("hi")]).unwrap_err();
    assert!(matches!(err, TextError::NoChatTemplate), "{err}");
    assert_eq!(text.encode("").unwrap(), [2]);

    let mut meta = metadata();
    meta.remove("tokenizer.ggml.bos_token_id");
    let err = GgufTokenizer::from_gguf_metadata(&meta).err().unwrap();
    assert!(
        matches!(&err, TextError::MissingField { field } if field == "tokenizer.ggml.bos_token_id"),
        "{err}"
    );

    let mut meta = metadata();
    meta.insert(
        "tokenizer.ggml.merges".into(),
        Value::Array(vec![Value::String(" ".into())]),
    );
    let err = GgufTokenizer::from_gguf_metadata(&meta).err().unwrap();
    assert!(
        err.to_string()
            .starts_with("GGUF metadata field tokenizer.ggml.merges[0]:"),
        "{err}"
    );

    let mut meta = metadata();
    meta.insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
    let err = GgufTokenizer::from_gguf_metadata(&meta).err().unwrap();
    assert!(
        err.to_string()
            .starts_with("GGUF metadata field tokenizer.ggml.model:"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// llama.cpp's Gemma 4 vocabulary (models/ggml-vocab-gemma-4.gguf, 262,144 tokens and 514,906
/// merges from the real tokenizer) with its tokenizer test inputs and expected ids, in the
/// source tree tools/llamacpp_source.sh unpacks.
fn real_vocab() -> Option<PathBuf> {
    let base = std::env::var_os("SPECD_LLAMACPP_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/specd/llama.cpp"))
        })?;
    let path =
        base.join("src/llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-gemma-4.gguf");
    path.is_file().then_some(path)
}

#[test]
fn gemma4_real_vocabulary_matches_llama_cpps_tokenizer_tests() {
    let Some(path) = real_vocab() else {
        eprintln!(
            "WARNING: skipping the real Gemma 4 vocabulary test: llama.cpp's source tree is not \
             unpacked (tools/llamacpp_source.sh; SPECD_LLAMACPP_DIR)"
        );
        return;
    };
    let read = |ext: &str| {
        let mut name = path.clone().into_os_string();
        name.push(ext);
        std::fs::read_to_string(name).unwrap()
    };
    let inputs = read(".inp");
    let outputs = read(".out");
    let inputs: Vec<&str> = inputs.split("\n__ggml_vocab_test__\n").collect();
    let outputs: Vec<&str> = outputs.lines().collect();
    assert!(inputs.len() > 40 && outputs.len() >= inputs.len());

    let tok = GgufTokenizer::for_model(&path).unwrap();
    for (input, output) in inputs.iter().zip(&outputs) {
        let expected: Vec<u32> = output
            .split_whitespace()
            .map(|id| id.parse().unwrap())
            .collect();
        assert_eq!(tok.encode(input).unwrap(), expected, "{input:?}");
        assert_eq!(tok.decode(&expected, false).unwrap(), *input);
    }
    let id = |t: &str| tok.token_to_id(t).unwrap();
    let mut stops = vec![id("<eos>"), id("<turn|>"), id("<|tool_response>")];
    stops.sort_unstable();
    assert_eq!(tok.eos_token_ids(), stops.as_slice());

    // Gemma 4's own chat template, as the file carries it.
    let text = TargetText::load(&path).unwrap();
    let messages = [
        ChatMessage::system("Be brief."),
        ChatMessage::user("What is the capital of France?"),
    ];
    assert_eq!(
        text.render_chat(&messages).unwrap(),
        "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nWhat is the capital of \
         France?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
    );
    let ids = text.encode_chat(&messages).unwrap();
    assert_eq!(ids[..2], [id("<bos>"), id("<|turn>")]);
    assert_eq!(ids.iter().filter(|&&i| i == id("<bos>")).count(), 1);

    // An assistant turn goes through the template's str.split (its thinking is cut out).
    let messages = [
        ChatMessage::user("Hi"),
        ChatMessage::assistant("<|channel>thought\nGreet back.<channel|>Hello!"),
        ChatMessage::user("Bye"),
    ];
    assert_eq!(
        text.render_chat(&messages).unwrap(),
        "<bos><|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n<|turn>user\nBye<turn|>\n\
         <|turn>model\n<|channel>thought\n<channel|>"
    );
}
