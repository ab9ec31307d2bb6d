//! The prompt set of a benchmark: built-in code and prose prompts, a file of prompts, or
//! token ids for checkpoints without a tokenizer.

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::Encode;

/// A small mix of code and prose, so both repetitive and free-form continuations are timed.
const BUILT_IN: [&str; 4] = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Rust function that reverses the words of a sentence.",
    "Explain in a short paragraph why the sky is blue.",
    "Write a short story opening about a lighthouse keeper.",
];

/// One prompt, as text (when known) and as the ids the model sees.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub label: String,
    pub ids: Vec<u32>,
}

/// Prompt texts: one per non-empty line of `file`, or the built-in set.
pub fn texts(file: Option<&Path>) -> Result<Vec<String>> {
    let Some(file) = file else {
        return Ok(BUILT_IN.iter().map(|s| (*s).to_owned()).collect());
    };
    let body = std::fs::read_to_string(file)
        .with_context(|| format!("prompts: reading {}", file.display()))?;
    let lines: Vec<String> = body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    if lines.is_empty() {
        bail!("prompts: {} has no non-empty line", file.display());
    }
    Ok(lines)
}

/// Parses one line of comma-separated token ids.
pub fn parse_ids(line: &str, field: &str) -> Result<Vec<u32>> {
    let ids = line
        .split(',')
        .map(|part| {
            part.trim()
                .parse::<u32>()
                .with_context(|| format!("{field}: {part:?} is not a token id"))
        })
        .collect::<Result<Vec<u32>>>()?;
    if ids.is_empty() {
        bail!("{field}: no token ids");
    }
    Ok(ids)
}

/// Checks every id against the vocabulary, naming the prompt and index of a bad one.
pub fn check_vocab(prompts: &[Prompt], vocab: usize) -> Result<()> {
    for prompt in prompts {
        if prompt.ids.is_empty() {
            bail!("prompt {:?}: empty after tokenization", prompt.label);
        }
        if let Some((i, id)) = prompt
            .ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= vocab)
        {
            bail!(
                "prompt {:?}: token {i} ({id}) is not below the vocabulary size {vocab}",
                prompt.label
            );
        }
    }
    Ok(())
}

/// A prompt of exactly `len` tokens, the same on every run: the built-in prompts' text,
/// tokenized as is (no chat template) and repeated.
pub fn long_prompt(encode: Encode<'_>, len: usize) -> Result<Vec<u32>> {
    let ids = encode(&BUILT_IN.join("\n"))?;
    if ids.is_empty() {
        bail!("long prompt: the built-in prompts tokenize to nothing");
    }
    Ok(ids.iter().copied().cycle().take(len).collect())
}

/// `ids` repeated until it is `len` tokens long: a long context with the same content.
pub fn lengthen(ids: &[u32], len: usize) -> Vec<u32> {
    ids.iter()
        .copied()
        .cycle()
        .take(len.max(ids.len()))
        .collect()
}
