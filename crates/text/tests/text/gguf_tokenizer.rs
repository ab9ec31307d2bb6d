//! The GGUF-metadata tokenizer and the chat template on a small synthetic byte-level BPE
//! vocabulary, so they are covered without the real model files.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use specd_text::{ChatMessage, ChatTemplate, GgufTokenizer, TextError, QWEN2_5_CHAT_TEMPLATE};

/// GPT-2's byte-to-character map: printable bytes stand for themselves, the rest are shifted
/// to code points from 256 up.
fn byte_chars() -> Vec<char> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut shifted = 0;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                shifted += 1;
                char::from_u32(255 + shifted).unwrap()
            }
        })
        .collect()
}

const MERGES: [&str; 8] = [
    "h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "1 2", "12 3",
];
const SPECIALS: [(&str, i32); 3] = [("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3)];
const TOOL_CALL: &str = "<tool_call>";

fn metadata(pre: &str) -> HashMap<String, Value> {
    let mut tokens: Vec<String> = byte_chars().iter().map(|c| c.to_string()).collect();
    let mut types = vec![1i32; tokens.len()];
    for merge in MERGES {
        tokens.push(merge.replace(' ', ""));
        types.push(1);
    }
    for (token, kind) in SPECIALS {
        tokens.push(token.into());
        types.push(kind);
    }
    tokens.push(TOOL_CALL.into());
    types.push(4);
    let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
    let eos = tokens.iter().position(|t| t == "<|im_end|>").unwrap() as u32;
    HashMap::from([
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("gpt2".into()),
        ),
        ("tokenizer.ggml.pre".to_string(), Value::String(pre.into())),
        ("tokenizer.ggml.tokens".to_string(), strings(tokens)),
        (
            "tokenizer.ggml.token_type".to_string(),
            Value::Array(types.into_iter().map(Value::I32).collect()),
        ),
        (
            "tokenizer.ggml.merges".to_string(),
            strings(MERGES.iter().map(|m| m.to_string()).collect()),
        ),
        ("tokenizer.ggml.eos_token_id".to_string(), Value::U32(eos)),
    ])
}

fn tokenizer() -> GgufTokenizer {
    GgufTokenizer::from_gguf_metadata(&metadata("qwen2")).unwrap()
}

#[test]
fn merges_apply_and_every_byte_round_trips() {
    let tok = tokenizer();
    let hello = tok.token_to_id("hello").unwrap();
    let world_prefix = tok.token_to_id("Ġwo").unwrap();
    let ids = tok.encode("hello world").unwrap();
    assert_eq!(ids[..2], [hello, world_prefix]);
    for text in [
        "hello world",
        "def f(x):\r\n\treturn x ** 2  # ok\n",
        "你好，世界！ 日本語 한국어",
        "🚀🔥 👩‍💻 café — “quoted”",
        "trailing spaces   \n\n",
        "\u{0}\u{1}\u{7f} control bytes",
    ] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            text,
            "{text:?} -> {ids:?}"
        );
    }
}

#[test]
fn special_and_user_defined_tokens_are_single_ids() {
    let tok = tokenizer();
    let im_start = tok.token_to_id("<|im_start|>").unwrap();
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    let endoftext = tok.token_to_id("<|endoftext|>").unwrap();
    let tool_call = tok.token_to_id(TOOL_CALL).unwrap();
    let ids = tok
        .encode("<|im_start|>hello<|im_end|><tool_call>")
        .unwrap();
    assert_eq!(
        ids,
        vec![
            im_start,
            tok.token_to_id("hello").unwrap(),
            im_end,
            tool_call
        ]
    );
    // Control tokens are dropped when skipping special tokens; <tool_call> is text.
    assert_eq!(tok.decode(&ids, true).unwrap(), "hello<tool_call>");
    // The GGUF eos plus the Qwen chat terminators present in the vocabulary.
    let mut expected = vec![endoftext, im_end];
    expected.sort_unstable();
    assert_eq!(tok.eos_token_ids(), expected.as_slice());
    assert!(tok.is_eos(im_end) && !tok.is_eos(im_start));
    assert_eq!(tok.vocab_size(), 256 + MERGES.len() + SPECIALS.len() + 1);
}

#[test]
fn tokenizer_json_written_from_metadata_loads_back_identically() {
    let tok = tokenizer();
    let path =
        std::env::temp_dir().join(format!("specd-qwen2-tokenizer-{}.json", std::process::id()));
    tok.inner().save(&path, false).unwrap();
    let reloaded = GgufTokenizer::from_tokenizer_json(&path, &metadata("qwen2")).unwrap();
    let _ = std::fs::remove_file(&path);
    let text = "<|im_start|>user\nhello world 🚀<|im_end|>\n";
    assert_eq!(reloaded.encode(text).unwrap(), tok.encode(text).unwrap());
    assert_eq!(reloaded.eos_token_ids(), tok.eos_token_ids());
}

#[test]
fn unsupported_or_broken_metadata_is_named() {
    let err = GgufTokenizer::from_gguf_metadata(&metadata("deepseek-llm"))
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .starts_with("GGUF metadata field tokenizer.ggml.pre:"),
        "{err}"
    );

    let mut broken = metadata("qwen2");
    broken.insert(
        "tokenizer.ggml.merges".into(),
        Value::Array(vec![Value::String("nospace".into())]),
    );
    let err = GgufTokenizer::from_gguf_metadata(&broken).err().unwrap();
    assert!(
        err.to_string()
            .starts_with("GGUF metadata field tokenizer.ggml.merges[0]:"),
        "{err}"
    );

    let mut missing = metadata("qwen2");
    missing.remove("tokenizer.ggml.tokens");
    let err = GgufTokenizer::from_gguf_metadata(&missing).err().unwrap();
    assert!(
        matches!(&err, TextError::MissingField { field } if field == "tokenizer.ggml.tokens"),
        "{err}"
    );
}

/// Each pre-tokenizer splits digits as its family does (llama.cpp's `llama-vocab.cpp`): Qwen2
/// and SmolLM one by one, Llama 3 in runs of up to three, so only Llama 3 merges "123".
#[test]
fn pre_tokenizers_split_digits_as_their_family_does() {
    let ids = |pre: &str| {
        let tok = GgufTokenizer::from_gguf_metadata(&metadata(pre)).unwrap();
        let id = |t: &str| tok.token_to_id(t).unwrap();
        let digits = ["1", "2", "3", "4", "5"].map(id).to_vec();
        (tok.encode("12345").unwrap(), digits, id("123"))
    };
    for pre in ["qwen2", "smollm"] {
        let (encoded, digits, _) = ids(pre);
        assert_eq!(encoded, digits, "{pre}");
    }
    let (encoded, digits, merged) = ids("llama-bpe");
    assert_eq!(encoded, vec![merged, digits[3], digits[4]]);
    // SmolLM's GPT-2 split keeps a space with the word after it, and round-trips text.
    let smollm = GgufTokenizer::from_gguf_metadata(&metadata("smollm")).unwrap();
    let ids = smollm.encode("hello world 42").unwrap();
    assert_eq!(
        ids[..2],
        [
            smollm.token_to_id("hello").unwrap(),
            smollm.token_to_id("Ġwo").unwrap()
        ]
    );
    assert_eq!(smollm.decode(&ids, false).unwrap(), "hello world 42");
}

/// Llama 3's files ask for a BOS before a text prompt (`add_bos_token`); Qwen's do not.
#[test]
fn a_bos_starts_the_text_where_the_file_asks_for_one() {
    let mut meta = metadata("llama-bpe");
    let bos = 256 + MERGES.len() as u32; // <|endoftext|>
    meta.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(bos));
    meta.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(true));
    let tok = GgufTokenizer::from_gguf_metadata(&meta).unwrap();
    // Special tokens are added to a text prompt (as TargetText::encode asks), never to text
    // that a chat template has rendered with its own BOS.
    let with_specials = tok.inner().encode("hello", true).unwrap();
    assert_eq!(with_specials.get_ids(), [bos, 256 + 3]);
    assert_eq!(tok.encode("hello").unwrap(), vec![256 + 3]);

    meta.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(100_000));
    let err = GgufTokenizer::from_gguf_metadata(&meta).err().unwrap();
    assert!(
        err.to_string().contains("tokenizer.ggml.bos_token_id"),
        "{err}"
    );
}

#[test]
fn chat_template_comes_from_metadata_or_falls_back_to_qwen_2_5() {
    let messages = [ChatMessage::system("Be brief."), ChatMessage::user("Hi")];
    let qwen = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";

    let fallback = ChatTemplate::from_gguf_metadata(&HashMap::new()).unwrap();
    assert_eq!(fallback.render(&messages, true).unwrap(), qwen);
    assert_eq!(
        fallback.render(&messages, false).unwrap(),
        qwen.trim_end_matches("<|im_start|>assistant\n")
    );

    let mut meta = HashMap::new();
    let custom = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}>{% endif %}";
    meta.insert(
        "tokenizer.chat_template".to_string(),
        Value::String(custom.into()),
    );
    let template = ChatTemplate::from_gguf_metadata(&meta).unwrap();
    assert_eq!(
        template.render(&messages, true).unwrap(),
        "[system] Be brief.\n[user] Hi\n>"
    );

    // Python's string methods, which templates written for Jinja call.
    let python = ChatTemplate::new(
        "{% for m in messages %}{{ m.content.split(' ')[0].upper() }}|{{ m.role.strip('sy') }};{% endfor %}",
    )
    .unwrap();
    assert_eq!(python.render(&messages, false).unwrap(), "BE|tem;HI|user;");

    let raising = ChatTemplate::new("{{ raise_exception('roles must alternate') }}").unwrap();
    let err = raising.render(&messages, true).unwrap_err();
    assert!(err.to_string().contains("roles must alternate"), "{err}");
    assert!(ChatTemplate::new("{% if %}").is_err());
    assert!(QWEN2_5_CHAT_TEMPLATE.starts_with("{%- if tools %}"));

    // The template plus the tokenizer: markup becomes single ids.
    let tok = tokenizer();
    let ids = tok
        .encode(&fallback.render(&messages, true).unwrap())
        .unwrap();
    let im_start = tok.token_to_id("<|im_start|>").unwrap();
    assert_eq!(ids.iter().filter(|&&id| id == im_start).count(), 3);
}

#[test]
fn for_model_prefers_tokenizer_json_beside_the_gguf() {
    use candle_core::quantized::gguf_file;
    let dir = std::env::temp_dir().join(format!("specd-text-for-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gguf_path = dir.join("model.gguf");
    let meta = metadata("qwen2");
    let refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut std::fs::File::create(&gguf_path).unwrap(), &refs, &[]).unwrap();

    let from_metadata = GgufTokenizer::for_model(&gguf_path).unwrap();
    assert_eq!(from_metadata.token_to_id("<|extra|>"), None);

    // A tokenizer.json that differs (one more added token) must win once it is there.
    let mut json = from_metadata.inner().clone();
    json.add_special_tokens(&[tokenizers::AddedToken::from("<|extra|>", true)]);
    json.save(dir.join("tokenizer.json"), false).unwrap();
    let from_json = GgufTokenizer::for_model(&gguf_path).unwrap();
    assert!(from_json.token_to_id("<|extra|>").is_some());
    assert_eq!(from_json.eos_token_ids(), from_metadata.eos_token_ids());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_gguf_targets_text_renders_chat_and_stops_at_the_turn_end() {
    use specd_core::Detokenizer;
    use specd_text::TargetText;
    let dir = std::env::temp_dir().join(format!("specd-text-target-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gguf_path = dir.join("model.gguf");
    let meta = metadata("qwen2");
    let refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    candle_core::quantized::gguf_file::write(
        &mut std::fs::File::create(&gguf_path).unwrap(),
        &refs,
        &[],
    )
    .unwrap();

    let text = TargetText::load(&gguf_path).unwrap();
    let tok = tokenizer();
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    let endoftext = tok.token_to_id("<|endoftext|>").unwrap();
    assert!(text.has_chat_template());
    assert!(text.end_of_turn_ids().contains(&im_end));
    assert!(text.end_of_turn_ids().contains(&endoftext));

    // No template in the file: the Qwen 2.5 one, encoded without added tokens.
    let messages = [ChatMessage::system("Be brief."), ChatMessage::user("hello")];
    let rendered = text.render_chat(&messages).unwrap();
    assert!(
        rendered.ends_with("<|im_start|>assistant\n"),
        "{rendered:?}"
    );
    assert_eq!(
        text.encode_chat(&messages).unwrap(),
        tok.encode(&rendered).unwrap()
    );
    // Decoded text leaves special tokens out.
    let hello = tok.token_to_id("hello").unwrap();
    assert_eq!(text.decode(&[hello, im_end]).unwrap(), "hello");
    let _ = std::fs::remove_dir_all(&dir);
}
