//! `specd generate` on a Gemma 4 GGUF carrying Gemma 4's tokenizer (`tokenizer.ggml.model =
//! gemma4`): a text prompt becomes one user message through the GGUF's chat template, or with
//! `--raw-prompt` the ids llama.cpp's llama-tokenize gives, and the output comes with its text. The target is made here from the converted tiny target-full: its
//! embedding tables are repeated up to the 1,024 tokens of the Gemma 4-style tokenizer fixture
//! of crates/text (tools/gemma4_tokenizer_fixture.py), whose `tokenizer.*` metadata replaces
//! the stub tokenizer's.

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use specd_text::TargetText;

use crate::common::{gguf_fixture, ids, join, json_of};
use crate::served::{http_post, Service};

fn text_fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../text/tests/fixtures")
}

/// Tables with a row per token.
const VOCAB_TABLES: [&str; 2] = ["token_embd.weight", "per_layer_token_embd.weight"];

fn target_with_gemma4_tokenizer(dir: &Path) -> PathBuf {
    let source = gguf_fixture("target-full");
    let mut model = std::fs::File::open(&source).unwrap();
    let content = Content::read(&mut model).unwrap();
    let tokenizer =
        specd_text::read_metadata(&text_fixtures().join("gemma4-tokenizer.gguf")).unwrap();
    let Some(Value::Array(tokens)) = tokenizer.get("tokenizer.ggml.tokens") else {
        panic!("the tokenizer fixture has no tokens");
    };
    let vocab = tokens.len();

    let mut metadata: Vec<(&str, &Value)> = content
        .metadata
        .iter()
        .filter(|(key, _)| !key.starts_with("tokenizer."))
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    metadata.extend(
        tokenizer
            .iter()
            .filter(|(key, _)| key.starts_with("tokenizer."))
            .map(|(k, v)| (k.as_str(), v)),
    );
    let mut tensors = Vec::new();
    for name in content.tensor_infos.keys() {
        let mut tensor = content.tensor(&mut model, name, &Device::Cpu).unwrap();
        if VOCAB_TABLES.contains(&name.as_str()) {
            let rows = tensor.dequantize(&Device::Cpu).unwrap();
            let copies = vocab / rows.dim(0).unwrap();
            let widened = Tensor::cat(&vec![&rows; copies], 0).unwrap();
            assert_eq!(widened.dim(0).unwrap(), vocab, "{name}");
            tensor = QTensor::quantize(&widened, GgmlDType::F32).unwrap();
        }
        tensors.push((name.as_str(), tensor));
    }
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    let path = dir.join("target-full-gemma4-tokenizer.gguf");
    gguf_file::write(
        &mut std::fs::File::create(&path).unwrap(),
        &metadata,
        &tensors,
    )
    .unwrap();
    path
}

/// The tokenizer fixture's references: llama-tokenize's encodings and rendered chats.
fn references() -> serde_json::Value {
    serde_json::from_str(
        &std::fs::read_to_string(text_fixtures().join("gemma4-tokenizer.references.json")).unwrap(),
    )
    .unwrap()
}

/// The reference encoding of `text`.
fn encoding<'a>(references: &'a serde_json::Value, text: &str) -> &'a serde_json::Value {
    references["encodings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["text"] == text)
        .unwrap_or_else(|| panic!("no reference encoding of {text:?}"))
}

#[test]
fn a_gemma4_gguf_with_its_tokenizer_takes_text_prompts_and_gives_text() {
    let dir = std::env::temp_dir().join(format!("specd-cli-gemma4-text-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let target = target_with_gemma4_tokenizer(&dir);
    let references = references();
    let reference = encoding(&references, "one\n\ntwo\n\n\nthree");

    let generate = |prompt: &[&str], drafting: &[&str], ignore_eos: bool| {
        let out = Command::new(env!("CARGO_BIN_EXE_specd"))
            .args(["generate", "--target"])
            .arg(&target)
            .args(prompt)
            .args(drafting)
            .args(["--max-tokens", "20", "--json"])
            .args(ignore_eos.then_some("--ignore-eos"))
            .output()
            .unwrap();
        json_of(out)
    };
    let prompt_ids = join(&ids(&reference["ids"]));
    let text = reference["text"].as_str().unwrap();
    let by_ids = generate(&["--prompt-ids", &prompt_ids], &["--no-draft"], true);
    let by_text = generate(&["--prompt", text, "--raw-prompt"], &["--no-draft"], true);
    // The raw text prompt is llama.cpp's encoding, BOS included: the same continuation, and
    // text.
    assert_eq!(by_text["tokens"], by_ids["tokens"]);
    assert_eq!(by_text["text"], by_ids["text"]);
    assert!(!by_text["text"].as_str().unwrap().is_empty());
    // Without --raw-prompt the text is one user message through the GGUF's chat template.
    let chat = &references["chats"][0];
    assert_eq!(chat["messages"].as_array().unwrap().len(), 1);
    let user = chat["messages"][0]["content"].as_str().unwrap();
    let by_chat_ids = generate(
        &["--prompt-ids", &join(&ids(&chat["ids"]))],
        &["--no-draft"],
        true,
    );
    let by_chat_text = generate(&["--prompt", user], &["--no-draft"], true);
    assert_eq!(by_chat_text["tokens"], by_chat_ids["tokens"]);
    assert_ne!(by_chat_text["tokens"], by_text["tokens"]);
    // Speculation keeps the tokens and the text.
    let speculative = generate(
        &["--prompt", text, "--raw-prompt"],
        &["--draft", "ngram", "--block-size", "4"],
        true,
    );
    assert_eq!(speculative["tokens"], by_text["tokens"]);
    assert_eq!(speculative["text"], by_text["text"]);

    // Without --ignore-eos the run ends at the first of the tokenizer's stop ids (<eos>,
    // <turn|>, <|tool_response>), whatever the model config's eos id is.
    let stops = TargetText::load(&target).unwrap().eos_token_ids().to_vec();
    let all = ids(&by_text["tokens"]);
    let first_stop = all
        .iter()
        .position(|&id| stops.contains(&(id as u32)))
        .expect("the fixture's continuation reaches a stop id");
    let stopped = generate(&["--prompt", text, "--raw-prompt"], &["--no-draft"], false);
    assert_eq!(ids(&stopped["tokens"]), all[..=first_stop]);
    assert_eq!(stopped["finish_reason"], "eos");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_router_over_a_gemma4_gguf_takes_text_and_chat_messages() {
    let dir = std::env::temp_dir().join(format!("specd-cli-gemma4-router-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let target = target_with_gemma4_tokenizer(&dir);
    let references = references();
    let reference = encoding(&references, "one\n\ntwo\n\n\nthree");
    let text = reference["text"].as_str().unwrap();
    let by_cli = json_of(
        Command::new(env!("CARGO_BIN_EXE_specd"))
            .args(["generate", "--target"])
            .arg(&target)
            .args([
                "--prompt",
                text,
                "--raw-prompt",
                "--no-draft",
                "--ignore-eos",
            ])
            .args(["--max-tokens", "12", "--json"])
            .output()
            .unwrap(),
    );

    let target = target.to_string_lossy().into_owned();
    let verifier = Service::start(&["verifier", "--target", &target]);
    let (_router, http) = Service::router_with_http(&[
        "--verifier",
        &verifier.url,
        "--target",
        &target,
        "--draft",
        "ngram",
    ]);
    // A text prompt: the router encodes it as llama.cpp does (BOS included) and answers with
    // the text the one-process CLI prints, speculating or not.
    let body = serde_json::json!({
        "prompt": text,
        "max_tokens": 12,
        "temperature": 0,
        "specd": {"ignore_eos": true, "block_size": 4},
    });
    let (status, answer) = http_post(&http, "/v1/completions", &body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["text"], by_cli["text"], "{answer}");
    assert_eq!(
        answer["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        ids(&reference["ids"]).len()
    );
    // Chat messages go through the GGUF's own template: the prompt is the reference
    // rendering's tokens.
    let chat = &references["chats"][0];
    let body = serde_json::json!({
        "messages": chat["messages"],
        "max_tokens": 8,
        "temperature": 0,
        "specd": {"ignore_eos": true},
    });
    let (status, answer) = http_post(&http, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        ids(&chat["ids"]).len(),
        "{answer}"
    );
    assert_eq!(answer["usage"]["completion_tokens"], 8, "{answer}");
    let _ = std::fs::remove_dir_all(&dir);
}
