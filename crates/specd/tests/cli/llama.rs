//! A Llama GGUF (SmolLM2-135M-Instruct, fetched by tools/fetch_smollm2.sh) through `specd
//! generate`, which has no code of its own for the family: llama.cpp's answer on the same
//! prompt, and speculation on it (the model drafting for itself, and prompt lookup) as lossless
//! as on Qwen2. Skipped, loudly, when the file has not been fetched.

use std::path::PathBuf;
use std::process::Command;

use crate::common::json_of;
use serde_json::Value;

fn smollm2() -> Option<PathBuf> {
    let path = crate::real_pair::model_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if path.is_file() {
        return Some(path);
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {} not found; run tools/fetch_smollm2.sh",
        path.display()
    );
    None
}

fn generate(model: &PathBuf, prompt: &str, extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["generate", "--target"])
        .arg(model)
        .args([
            "--prompt",
            prompt,
            "--raw-prompt",
            "--max-tokens",
            "32",
            "--json",
        ])
        .args(extra)
        .output()
        .unwrap();
    json_of(out)
}

#[test]
fn a_llama_gguf_answers_as_llama_cpp_and_speculates_losslessly() {
    let Some(model) = smollm2() else {
        return;
    };
    // llama.cpp (`llama-completion --temp 0`) answers this prompt with the same text.
    let chat =
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    let plain = generate(&model, chat, &["--no-draft"]);
    assert_eq!(plain["text"], "The capital of France is Paris.", "{plain}");
    assert_eq!(plain["finish_reason"], "eos", "{plain}");

    let code = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";
    let model_path = model.to_str().unwrap();
    for (prompt, sampling) in [
        (chat, &[][..]),
        (code, &[][..]),
        (code, &["--temperature", "0.8", "--seed", "3"][..]),
    ] {
        let plain = generate(&model, prompt, &[&["--no-draft"], sampling].concat());
        let tokens = &plain["tokens"];
        let drafting = [
            &["--draft", "draft-model", "--drafter", model_path][..],
            &["--draft", "ngram"][..],
        ];
        for draft in drafting {
            let spec = generate(&model, prompt, &[draft, sampling].concat());
            assert_eq!(
                &spec["tokens"], tokens,
                "{draft:?} {sampling:?} on {prompt:?}"
            );
        }
    }
    // Drafting for itself, the model has its drafts accepted.
    let spec = generate(
        &model,
        code,
        &["--draft", "draft-model", "--drafter", model_path],
    );
    assert!(spec["stats"]["accepted"].as_u64().unwrap() > 0, "{spec}");
}

/// The one-process server runs a GGUF draft model behind prompt lookup unless `--draft`
/// says otherwise: its rounds count as `hybrid` rounds, and `--draft draft-model` keeps the
/// model alone.
#[test]
fn one_process_drafts_hybrid_by_default() {
    let Some(model) = smollm2() else {
        return;
    };
    let model = model.to_str().unwrap();
    for (extra, kind) in [
        (&[][..], "hybrid"),
        (&["--draft", "draft-model"][..], "model"),
    ] {
        let mut args = vec!["--target", model, "--drafter", model];
        args.extend_from_slice(extra);
        let (_server, http, metrics) = crate::served::Service::one_process_with_metrics(&args);
        let (status, body) = crate::served::http_post(
            &http,
            "/v1/completions",
            &serde_json::json!({
                "prompt": "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
                "max_tokens": 24,
                "temperature": 0,
                "specd": {"ignore_eos": true},
            }),
        );
        assert_eq!(status, 200, "{body}");
        let scraped = crate::telemetry::scrape(&metrics);
        let rounds = |kind| {
            crate::telemetry::sample_sum(&scraped, "specd_rounds_total", &[("drafter_kind", kind)])
        };
        assert!(rounds(kind) > 0.0, "no {kind} round:\n{scraped}");
        let other = if kind == "hybrid" { "model" } else { "hybrid" };
        assert_eq!(rounds(other), 0.0, "{other} rounds with {extra:?}");
    }
}
