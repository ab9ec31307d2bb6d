//! The real Qwen2.5-Coder pair (1.5B target, 0.5B drafter), when `tools/fetch_qwen_pair.sh`
//! has put it in the model dir; otherwise each test warns loudly on stderr and returns.

use std::path::Path;

use crate::qwen2_support::{argmax_rows, compare, greedy_steps_and_block, real_pair};
use candle_core::quantized::gguf_file::Value;
use candle_core::Device;
use specd_models::qwen2::{GgufFile, Qwen2Model};
use specd_text::{ChatMessage, ChatTemplate, GgufTokenizer, QWEN2_5_CHAT_TEMPLATE};

const IM_START: u32 = 151644;
const IM_END: u32 = 151645;
const ENDOFTEXT: u32 = 151643;

fn tokenizer(path: &Path) -> GgufTokenizer {
    GgufTokenizer::from_gguf_metadata(GgufFile::open(path).unwrap().metadata()).unwrap()
}

#[test]
fn tokenizer_round_trips_code_cjk_emoji_and_chat_markup() {
    let Some((target, _)) = real_pair("tokenizer_round_trips_code_cjk_emoji_and_chat_markup")
    else {
        return;
    };
    let tok = tokenizer(&target);
    let texts = [
        "def quicksort(arr):\n    \"\"\"Sort a list.\"\"\"\n\tif len(arr) <= 1:\r\n        return arr\n",
        "fn main() { let v: Vec<u8> = vec![0x1f, 255]; println!(\"{v:?}\"); }",
        "你好，世界！这是一个测试。日本語のテキストも。한국어도.",
        "emoji: 🚀🔥 👩‍💻 🇯🇵 ✨ — “quotes” and café",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "   leading spaces, trailing spaces   \n\n\n  ",
    ];
    for text in texts {
        let ids = tok.encode(text).unwrap();
        assert!(!ids.is_empty());
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            text,
            "round trip of {text:?} via {ids:?}"
        );
    }
    // Known ids of Qwen2's vocabulary; chat markup maps to single special ids.
    assert_eq!(tok.encode("Hello world").unwrap(), vec![9707, 1879]);
    assert_eq!(tok.encode("<|im_start|>user\n").unwrap()[0], IM_START);
    assert_eq!(tok.encode("<|im_end|>").unwrap(), vec![IM_END]);
    assert_eq!(tok.token_to_id("<tool_call>"), Some(151657));
    assert_eq!(tok.eos_token_ids(), &[ENDOFTEXT, IM_END]);
    assert_eq!(
        tok.decode(&[IM_START, 9707, IM_END], true).unwrap(),
        "Hello"
    );
}

#[test]
fn chat_template_renders_the_qwen_prompt() {
    let Some((target, _)) = real_pair("chat_template_renders_the_qwen_prompt") else {
        return;
    };
    let gguf = GgufFile::open(&target).unwrap();
    let from_gguf = ChatTemplate::from_gguf_metadata(gguf.metadata()).unwrap();
    let fallback = ChatTemplate::qwen2_5().unwrap();
    let with_system = [
        ChatMessage::system("You are a helpful assistant."),
        ChatMessage::user("Write hello world in Python."),
    ];
    let expected = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
                    <|im_start|>user\nWrite hello world in Python.<|im_end|>\n\
                    <|im_start|>assistant\n";
    assert_eq!(from_gguf.render(&with_system, true).unwrap(), expected);
    assert_eq!(fallback.render(&with_system, true).unwrap(), expected);

    let conversation = [
        ChatMessage::user("hi"),
        ChatMessage::assistant("Hello!"),
        ChatMessage::user("2+2?"),
    ];
    let expected = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
                    <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n\
                    <|im_start|>user\n2+2?<|im_end|>\n";
    assert_eq!(from_gguf.render(&conversation, false).unwrap(), expected);
    assert_eq!(fallback.render(&conversation, false).unwrap(), expected);

    assert!(QWEN2_5_CHAT_TEMPLATE.contains("<|im_start|>assistant\\n"));
    // The rendered prompt tokenizes with single ids for the markup.
    let ids = tokenizer(&target)
        .encode(&from_gguf.render(&with_system, true).unwrap())
        .unwrap();
    assert_eq!(ids.iter().filter(|&&id| id == IM_START).count(), 3);
    assert_eq!(ids.iter().filter(|&&id| id == IM_END).count(), 2);
}

#[test]
fn target_and_drafter_share_one_vocabulary() {
    let Some((target, drafter)) = real_pair("target_and_drafter_share_one_vocabulary") else {
        return;
    };
    let (t, d) = (
        GgufFile::open(&target).unwrap(),
        GgufFile::open(&drafter).unwrap(),
    );
    for field in [
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.token_type",
    ] {
        let (Some(Value::Array(a)), Some(Value::Array(b))) =
            (t.metadata().get(field), d.metadata().get(field))
        else {
            panic!("{field} missing");
        };
        assert_eq!(a.len(), b.len(), "{field} length");
        assert!(
            a.iter()
                .zip(b)
                .all(|(x, y)| format!("{x:?}") == format!("{y:?}")),
            "{field} differs"
        );
    }
    let (tt, dt) = (tokenizer(&target), tokenizer(&drafter));
    assert_eq!(tt.vocab_size(), dt.vocab_size());
    let text = "def add(a, b):\n    return a + b  # 合計 🚀";
    assert_eq!(tt.encode(text).unwrap(), dt.encode(text).unwrap());
    assert_eq!(tt.eos_token_ids(), dt.eos_token_ids());
}

#[test]
fn greedy_code_continuation_and_block_logits_match_steps() {
    let Some((target, _)) = real_pair("greedy_code_continuation_and_block_logits_match_steps")
    else {
        return;
    };
    let model = Qwen2Model::load(&target, &Device::Cpu).unwrap();
    let tok = tokenizer(&target);
    let prompt = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";
    let prompt_ids = tok.encode(prompt).unwrap();

    // Greedy decoding one token at a time after a prefill block; then, verify-style, the last
    // prompt token and the 15 generated tokens as one block, on a cache holding the prompt
    // minus its last token.
    let (generated, block, steps) = greedy_steps_and_block(&model, &prompt_ids, 16);
    let text = tok.decode(&generated, false).unwrap();
    eprintln!("greedy continuation: {text:?}");
    assert!(
        text.contains("if n") || text.contains("return"),
        "unexpected continuation {text:?}"
    );
    assert!(!generated.iter().any(|id| tok.is_eos(*id)));

    assert_eq!(
        argmax_rows(&block),
        generated,
        "block argmax differs from step argmax"
    );
    let (differing, max_diff) = compare(&block, &steps);
    eprintln!(
        "block of {} vs steps: {differing} differing logits, max diff {max_diff:e}",
        generated.len()
    );
    assert_eq!(
        differing, 0,
        "block logits are not bit-identical to step logits"
    );
}
