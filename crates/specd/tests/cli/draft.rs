//! `specd draft` as a user runs it, against transformers' first token and draft block.

use crate::common::{fixture, gguf_fixture, ids, join, json_of, reference};

use std::path::Path;
use std::process::Command;

fn draft(target: &str, drafter: &str, prompt_ids: &str, steps: usize) -> std::process::Output {
    draft_files(&fixture(target), &fixture(drafter), prompt_ids, steps)
}

fn draft_files(
    target: &Path,
    drafter: &Path,
    prompt_ids: &str,
    steps: usize,
) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(["draft", "--target"])
        .arg(target)
        .arg("--drafter")
        .arg(drafter)
        .args([
            "--prompt-ids",
            prompt_ids,
            "--steps",
            &steps.to_string(),
            "--json",
        ])
        .output()
        .unwrap()
}

#[test]
fn draft_json_equals_transformers_first_token_and_drafts() {
    for drafter in ["assistant-dense", "assistant-centroid", "assistant-nople"] {
        let reference = reference(drafter);
        let target = reference["target"].as_str().unwrap();
        for prompt in reference["prompts"].as_array().unwrap() {
            for steps in [3, 7] {
                let out = draft(target, drafter, &join(&ids(&prompt["prompt_ids"])), steps);
                let json = json_of(out);
                assert_eq!(json["first_token"], prompt["first_token"], "{drafter}");
                assert_eq!(
                    ids(&json["drafts"]),
                    ids(&prompt["drafts"])[..steps],
                    "{drafter} {}",
                    prompt["name"]
                );
            }
        }
    }
}

#[test]
fn draft_json_from_gguf_files_equals_transformers_drafts() {
    for drafter in ["assistant-dense", "assistant-moe"] {
        let reference = reference(drafter);
        let target = reference["target"].as_str().unwrap();
        for prompt in reference["prompts"].as_array().unwrap() {
            let prompt_ids = join(&ids(&prompt["prompt_ids"]));
            let out = draft_files(
                &gguf_fixture(target),
                &gguf_fixture(drafter),
                &prompt_ids,
                7,
            );
            let json = json_of(out);
            assert_eq!(json["first_token"], prompt["first_token"], "{drafter}");
            assert_eq!(
                ids(&json["drafts"]),
                ids(&prompt["drafts"])[..7],
                "{drafter} {}",
                prompt["name"]
            );
        }
    }
}

#[test]
fn mismatched_pair_is_refused_with_both_geometries_named() {
    let out = draft("target-nople", "assistant-dense", "2,17,30", 3);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("1 heads x 32 dims") && err.contains("2 heads x 32 dims"),
        "{err}"
    );
}

#[test]
fn bad_prompt_ids_are_refused_with_the_field_named() {
    let out = draft("target-full", "assistant-dense", "2,999", 3);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("prompt_ids[1]") && err.contains("999"),
        "{err}"
    );
}
