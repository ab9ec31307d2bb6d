//! `specd generate` as a user runs it, against transformers' greedy continuations.

use crate::common::{fixture, ids, join, json_of, reference};

use std::process::Command;

#[test]
fn no_draft_json_tokens_equal_transformers_greedy() {
    for name in ["target-full", "target-multimodal"] {
        let reference = reference(name);
        let prompt = &reference["prompts"][2];
        let want = ids(&prompt["greedy"]);
        let out = Command::new(env!("CARGO_BIN_EXE_specd"))
            .args(["generate", "--target"])
            .arg(fixture(name))
            .args([
                "--no-draft",
                "--prompt-ids",
                &join(&ids(&prompt["prompt_ids"])),
            ])
            .args([
                "--max-tokens",
                &want.len().to_string(),
                "--ignore-eos",
                "--json",
            ])
            .output()
            .unwrap();
        let json = json_of(out);
        assert_eq!(ids(&json["tokens"]), want, "{name}");
        assert_eq!(json["finish_reason"], "length");
        assert!(json.get("text").is_none(), "no tokenizer.json, so no text");
    }
}

#[test]
fn a_gemma4_gguf_target_generates_transformers_greedy_and_drafts_losslessly() {
    // The llama.cpp conversion of target-full: its tokenizer is not one the text side reads,
    // so the run goes by token ids.
    let gguf = fixture("target-full")
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("gemma4-gguf/target-full-f32.gguf");
    let reference = reference("target-full");
    let prompt = &reference["prompts"][2];
    let want = ids(&prompt["greedy"]);
    for drafting in [
        vec!["--no-draft"],
        vec!["--draft", "ngram", "--block-size", "4"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_specd"))
            .args(["generate", "--target"])
            .arg(&gguf)
            .args(&drafting)
            .args(["--prompt-ids", &join(&ids(&prompt["prompt_ids"]))])
            .args([
                "--max-tokens",
                &want.len().to_string(),
                "--ignore-eos",
                "--json",
            ])
            .output()
            .unwrap();
        let json = json_of(out);
        assert_eq!(ids(&json["tokens"]), want, "{drafting:?}");
    }
}

#[test]
fn q8_0_gemma4_gguf_targets_generate_and_draft_losslessly() {
    let dir = fixture("target-full")
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("gemma4-gguf");
    let run = |name: &str, prompt: &[u64], tokens: usize, drafting: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_specd"))
            .args(["generate", "--target"])
            .arg(dir.join(format!("{name}-q8_0.gguf")))
            .args(drafting)
            .args(["--prompt-ids", &join(prompt)])
            .args([
                "--max-tokens",
                &tokens.to_string(),
                "--ignore-eos",
                "--json",
            ])
            .output()
            .unwrap();
        ids(&json_of(out)["tokens"])
    };
    let speculative = ["--draft", "ngram", "--block-size", "4"];
    // On target-full's long prompt the Q8_0 continuation is transformers' greedy one (the
    // models crate's tests bound how far Q8_0 moves the logits elsewhere).
    let prompt = &reference("target-full")["prompts"][2];
    let want = ids(&prompt["greedy"]);
    let prompt_ids = ids(&prompt["prompt_ids"]);
    for drafting in [&["--no-draft"][..], &speculative[..]] {
        let got = run("target-full", &prompt_ids, want.len(), drafting);
        assert_eq!(got, want, "target-full {drafting:?}");
    }
    // Mixture of experts: speculative output is the plain output.
    let prompt_ids = ids(&reference("target-moe")["prompts"][1]["prompt_ids"]);
    let plain = run("target-moe", &prompt_ids, 32, &["--no-draft"]);
    assert_eq!(plain.len(), 32);
    assert_eq!(run("target-moe", &prompt_ids, 32, &speculative), plain);
}

#[test]
fn bad_prompt_ids_are_refused_with_the_field_named() {
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["generate", "--target"])
        .arg(fixture("target-full"))
        .args([
            "--no-draft",
            "--prompt-ids",
            "2,999999",
            "--max-tokens",
            "4",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("prompt_ids[1]") && err.contains("999999"),
        "{err}"
    );
}

#[test]
fn text_prompt_without_tokenizer_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["generate", "--target"])
        .arg(fixture("target-full"))
        .args(["--prompt", "hello", "--json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tokenizer.json"), "{err}");
}
