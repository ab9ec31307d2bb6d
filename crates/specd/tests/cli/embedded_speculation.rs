//! `specd generate --draft ngram|mtp|hybrid` in embedded mode prints the tokens `--no-draft`
//! prints, for every block size, greedy and seeded, from checkpoint directories or GGUF files.

use crate::common::{fixture, gguf_fixture, json_of};

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn target() -> PathBuf {
    fixture("target-full")
}

/// The mixture-of-experts target the `assistant-moe` fixture is paired with.
fn moe_target() -> PathBuf {
    fixture("target-moe")
}

/// Repetitive, so prompt lookup finds drafts.
const PROMPT: &str = "2,40,41,42,43,9,40,41,42,43,9,40,41,42,43,9";

fn generate(extra: &[&str]) -> Value {
    generate_on(&target(), extra)
}

fn generate_on(target: &std::path::Path, extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["generate", "--target"])
        .arg(target)
        .args([
            "--prompt-ids",
            PROMPT,
            "--max-tokens",
            "48",
            "--ignore-eos",
            "--json",
        ])
        .args(extra)
        .output()
        .unwrap();
    json_of(out)
}

/// Generates with `drafter_args` for block sizes 2..=8, greedy and seeded, asserting the
/// plain tokens each time; returns the drafts (drafted, accepted) over all runs.
fn assert_lossless(drafter_args: &[&str]) -> (u64, u64) {
    assert_lossless_on(&target(), drafter_args)
}

fn assert_lossless_on(target: &std::path::Path, drafter_args: &[&str]) -> (u64, u64) {
    let generate = |extra: &[&str]| generate_on(target, extra);
    let (mut drafted, mut accepted) = (0, 0);
    for sampling in [
        vec!["--temperature", "0"],
        vec!["--temperature", "0.8", "--seed", "7"],
        vec!["--temperature", "1.0", "--seed", "8"],
    ] {
        let mut plain_args = vec!["--no-draft"];
        plain_args.extend(&sampling);
        let plain = generate(&plain_args);
        assert_eq!(plain["stats"]["drafted"], 0);
        for block_size in 2..=8 {
            let block_size = block_size.to_string();
            let mut args = drafter_args.to_vec();
            args.extend(["--block-size", &block_size]);
            args.extend(&sampling);
            let out = generate(&args);
            assert_eq!(
                out["tokens"], plain["tokens"],
                "{drafter_args:?} block size {block_size}, {sampling:?}"
            );
            assert_eq!(out["finish_reason"], "length");
            drafted += out["stats"]["drafted"].as_u64().unwrap();
            accepted += out["stats"]["accepted"].as_u64().unwrap();
        }
    }
    (drafted, accepted)
}

#[test]
fn ngram_drafting_prints_the_plain_tokens() {
    let (_, accepted) = assert_lossless(&["--draft", "ngram"]);
    assert!(accepted > 0, "prompt lookup never had a draft accepted");
}

#[test]
fn mtp_drafting_prints_the_plain_tokens() {
    let drafter = fixture("assistant-dense");
    let drafter = drafter.to_str().unwrap();
    let (drafted, _) = assert_lossless(&["--draft", "mtp", "--drafter", drafter]);
    assert!(drafted > 0);
}

#[test]
fn gemma4_token_trees_print_the_plain_tokens() {
    // The tiny assistant's logits are nearly flat, so its runner-ups make branches; prompt
    // lookup branches where the matched n-gram had other followers.
    let assistant = fixture("assistant-dense");
    let assistant = assistant.to_str().unwrap();
    let mtp = ["--draft", "mtp", "--drafter", assistant];
    for sampling in [
        vec!["--temperature", "0"],
        vec!["--temperature", "0.8", "--seed", "7"],
    ] {
        let with = |extra: &[&str]| {
            let mut args = extra.to_vec();
            args.extend(&sampling);
            generate(&args)
        };
        let plain = with(&["--no-draft"]);
        for drafter in [&mtp[..], &["--draft", "ngram"]] {
            let mut trees = drafter.to_vec();
            trees.extend(["--block-size", "4", "--tree-nodes", "4"]);
            let tree = with(&trees);
            assert_eq!(tree["tokens"], plain["tokens"], "{drafter:?} {sampling:?}");
            let mut chains = drafter.to_vec();
            chains.extend(["--block-size", "4", "--tree-nodes", "0"]);
            let chain = with(&chains);
            assert_eq!(chain["tokens"], plain["tokens"], "{drafter:?} {sampling:?}");
            assert_eq!(chain["stats"]["tree_rounds"], 0);
            if drafter == mtp {
                // Greedy and seeded alike: a seeded tree's first choices are the drafts
                // drawn with the target's key, its branches the likeliest others.
                let rounds = tree["stats"]["tree_rounds"].as_u64().unwrap();
                assert!(
                    rounds > 0,
                    "no MTP tree round: {} {sampling:?}",
                    tree["stats"]
                );
            }
        }
    }
}

#[test]
fn mtp_drafting_on_a_mixture_of_experts_target_prints_the_plain_tokens() {
    let drafter = fixture("assistant-moe");
    let drafter = drafter.to_str().unwrap();
    let (drafted, _) = assert_lossless_on(&moe_target(), &["--draft", "mtp", "--drafter", drafter]);
    assert!(drafted > 0);
}

#[test]
fn mtp_drafting_from_gguf_files_prints_the_plain_tokens() {
    // llama.cpp's conversions of both pairs: target and assistant each a GGUF file.
    for (target, assistant) in [
        ("target-full", "assistant-dense"),
        ("target-moe", "assistant-moe"),
    ] {
        let drafter = gguf_fixture(assistant);
        let drafter = drafter.to_str().unwrap();
        let (drafted, _) = assert_lossless_on(
            &gguf_fixture(target),
            &["--draft", "mtp", "--drafter", drafter],
        );
        assert!(drafted > 0, "{assistant}");
    }
}

#[test]
fn hybrid_drafting_prints_the_plain_tokens() {
    // Lookup drafts the rounds that repeat the prompt, the assistant the others.
    let drafter = fixture("assistant-dense");
    let drafter = drafter.to_str().unwrap();
    let (drafted, accepted) = assert_lossless(&["--draft", "hybrid", "--drafter", drafter]);
    assert!(drafted > 0);
    assert!(accepted > 0);
}

#[test]
fn hybrid_needs_a_drafter() {
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["generate", "--target"])
        .arg(target())
        .args(["--prompt-ids", "2,3", "--draft", "hybrid"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--drafter"));
}

#[test]
fn mtp_needs_a_drafter_directory() {
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["generate", "--target"])
        .arg(target())
        .args(["--prompt-ids", "2,3", "--draft", "mtp"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--drafter"));
}

#[test]
fn draft_and_no_draft_conflict() {
    let out = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["generate", "--target"])
        .arg(target())
        .args(["--prompt-ids", "2,3", "--no-draft", "--draft", "ngram"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--draft"));
}

#[test]
fn a_gguf_assistant_alone_means_mtp() {
    let drafter = gguf_fixture("assistant-dense");
    let drafter = drafter.to_str().unwrap();
    let target = gguf_fixture("target-full");
    let plain = generate_on(&target, &["--no-draft"]);
    let spec = generate_on(&target, &["--drafter", drafter, "--block-size", "4"]);
    assert_eq!(spec["tokens"], plain["tokens"]);
    assert!(spec["stats"]["drafted"].as_u64().unwrap() > 0, "{spec}");
}

#[test]
fn a_drafter_directory_alone_means_mtp() {
    let drafter = fixture("assistant-dense");
    let drafter = drafter.to_str().unwrap();
    let plain = generate(&["--no-draft"]);
    let spec = generate(&["--drafter", drafter, "--block-size", "4"]);
    assert_eq!(spec["tokens"], plain["tokens"]);
    assert!(spec["stats"]["drafted"].as_u64().unwrap() > 0, "{spec}");
}
