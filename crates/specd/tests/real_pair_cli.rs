//! Lossless speculative decoding on the real Qwen2.5-Coder 1.5B / 0.5B GGUF pair, embedded:
//! the draft-model and n-gram drafters give exactly the target's own output, greedy and seeded.
//! Skipped, loudly, when the pair has not been fetched (tools/fetch_qwen_pair.sh).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

const TARGET: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
const DRAFTER: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

fn model_dir() -> PathBuf {
    match std::env::var_os("SPECD_MODEL_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/specd/models")
        }
    }
}

fn pair() -> Option<(PathBuf, PathBuf)> {
    let dir = model_dir();
    let (t, d) = (dir.join(TARGET), dir.join(DRAFTER));
    if t.is_file() && d.is_file() {
        Some((t, d))
    } else {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: real Qwen pair not found in {}; run tools/fetch_qwen_pair.sh",
            dir.display()
        );
        None
    }
}

fn generate(target: &PathBuf, prompt: &str, extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["generate", "--target"])
        .arg(target)
        .args(["--prompt", prompt, "--max-tokens", "40", "--json"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn speculative_output_equals_plain_output_on_the_real_pair() {
    let Some((target, drafter)) = pair() else {
        return;
    };
    let drafter = drafter.to_str().unwrap();
    let cases: [(&str, &[&str], &str); 2] = [
        (
            "Write a Python function that checks whether a string is a palindrome.",
            &[],
            "4",
        ),
        (
            "Explain in two sentences what a hash map is.",
            &["--temperature", "0.8", "--seed", "7"],
            "3",
        ),
    ];
    for (prompt, sampling, block) in cases {
        let plain = generate(&target, prompt, &[&["--no-draft"], sampling].concat());
        let tokens = &plain["tokens"];
        assert!(tokens.as_array().unwrap().len() >= 8, "{plain}");
        let spec = generate(
            &target,
            prompt,
            &[
                &[
                    "--draft",
                    "draft-model",
                    "--drafter",
                    drafter,
                    "--block-size",
                    block,
                ],
                sampling,
            ]
            .concat(),
        );
        assert_eq!(
            &spec["tokens"], tokens,
            "draft-model output differs for {prompt:?}"
        );
        assert_eq!(spec["text"], plain["text"]);
        let accepted = spec["stats"]["accepted"].as_u64().unwrap();
        assert!(
            accepted > 0,
            "the 0.5B drafter should get drafts accepted: {spec}"
        );
        let ngram = generate(
            &target,
            prompt,
            &[&["--draft", "ngram", "--block-size", block], sampling].concat(),
        );
        assert_eq!(
            &ngram["tokens"], tokens,
            "ngram output differs for {prompt:?}"
        );
    }
}

#[test]
fn a_drafter_that_is_not_a_gguf_model_is_refused() {
    let Some((target, _)) = pair() else { return };
    // A safetensors file is not a GGUF draft model; the error says which model failed to load.
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tests/fixtures/gemma4/target-full/model.safetensors");
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["generate", "--target"])
        .arg(&target)
        .args([
            "--prompt",
            "hi",
            "--max-tokens",
            "4",
            "--draft",
            "draft-model",
            "--drafter",
        ])
        .arg(&fixture)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("loading the drafter"), "{err}");
}
