//! The prompt set of a benchmark: built-in prompts grouped by kind, a file of prompts, or
//! token ids for checkpoints without a tokenizer.
//!
//! Kinds exist because what speculation gains depends on what the answer looks like: free
//! prose is hard for any drafter, code is more predictable, and an edit of given code mostly
//! copies the prompt, which prompt lookup (n-gram drafting) can draft with no model at all.

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::Encode;

/// The kind of the built-in prompts that write new code.
pub const CODE: &str = "code";
/// The kind of the built-in prompts that write prose.
pub const PROSE: &str = "prose";
/// The kind of the built-in prompts whose answer repeats code given in the prompt.
pub const EDIT: &str = "edit";
/// The kind of lines of a prompt file that name none.
pub const FILE: &str = "file";
/// The kind of a prompt given as token ids on the command line.
pub const IDS: &str = "ids";

/// The built-in set: a few short prompts of each kind, small enough that a 1.5B model on two
/// cores runs all of them in seconds per mode. Edit prompts ask for the code only, so that the
/// answer starts copying the snippet at once rather than after a paragraph of prose.
const BUILT_IN: [(&str, &str); 7] = [
    (
        CODE,
        "Write a Python function that returns the n-th Fibonacci number iteratively.",
    ),
    (
        CODE,
        "Write a Rust function that reverses the words of a sentence.",
    ),
    (PROSE, "Explain in a short paragraph why the sky is blue."),
    (
        PROSE,
        "Write a short story opening about a lighthouse keeper.",
    ),
    (EDIT, EDIT_RENAME),
    (EDIT, EDIT_TYPE_HINTS),
    (EDIT, EDIT_INDENT),
];

const EDIT_RENAME: &str = r#"Rename the variable `x` to `count` in this Python function. Reply with only the updated code.

```python
def summarize(values):
    x = 0
    total = 0.0
    smallest = None
    for value in values:
        if value is None:
            continue
        x += 1
        total += value
        if smallest is None or value < smallest:
            smallest = value
    if x == 0:
        return None
    mean = total / x
    print(f"{x} values, mean {mean:.2f}, smallest {smallest}")
    return {"count": x, "mean": mean, "smallest": smallest}
```"#;

const EDIT_TYPE_HINTS: &str = r#"Add type hints to these Python functions. Reply with only the updated code.

```python
def merge_intervals(intervals):
    if not intervals:
        return []
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = [list(ordered[0])]
    for start, end in ordered[1:]:
        last = merged[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    return [tuple(pair) for pair in merged]


def total_length(intervals):
    return sum(end - start for start, end in merge_intervals(intervals))
```"#;

const EDIT_INDENT: &str = r#"Rewrite this JavaScript code with 4-space indentation. Reply with only the code.

```javascript
function groupBy(items, key) {
  const groups = {};
  for (const item of items) {
    const k = item[key];
    if (!(k in groups)) {
      groups[k] = [];
    }
    groups[k].push(item);
  }
  return groups;
}

function countBy(items, key) {
  const counts = {};
  for (const [k, group] of Object.entries(groupBy(items, key))) {
    counts[k] = group.length;
  }
  return counts;
}
```"#;

/// One prompt, as text (when known) and as the ids the model sees.
#[derive(Debug, Clone)]
pub struct Prompt {
    /// What the prompt asks for (`code`, `prose`, `edit`, a prompt file's own kinds, `file`
    /// or `ids`); results are also given per kind.
    pub kind: String,
    pub label: String,
    pub ids: Vec<u32>,
}

/// A prompt's text and kind, before tokenization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptText {
    pub kind: String,
    pub text: String,
}

/// Prompt texts of the kinds in `kinds` (every kind when empty): the built-in set, or one
/// prompt per non-empty line of `file`. A file line `KIND<TAB>TEXT` gives its prompt a kind,
/// and its text may write a newline as `\n` (a tab as `\t`, a backslash as `\\`), so that
/// prompts quoting code fit on one line; any other line is one prompt of kind `file`, taken
/// as is.
pub fn texts(file: Option<&Path>, kinds: &[String]) -> Result<Vec<PromptText>> {
    let (all, source) = match file {
        None => (
            BUILT_IN
                .iter()
                .map(|(kind, text)| PromptText {
                    kind: (*kind).to_owned(),
                    text: (*text).to_owned(),
                })
                .collect::<Vec<_>>(),
            "the built-in prompts".to_owned(),
        ),
        Some(file) => {
            let body = std::fs::read_to_string(file)
                .with_context(|| format!("prompts: reading {}", file.display()))?;
            let lines: Vec<PromptText> = body
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(parse_line)
                .collect();
            if lines.is_empty() {
                bail!("prompts: {} has no non-empty line", file.display());
            }
            (lines, file.display().to_string())
        }
    };
    select(all, kinds, &source)
}

/// The prompts of the kinds asked for, in their original order; every kind named must have
/// at least one prompt, so a typo does not silently shrink the set.
fn select(all: Vec<PromptText>, kinds: &[String], source: &str) -> Result<Vec<PromptText>> {
    if kinds.is_empty() {
        return Ok(all);
    }
    let present = kinds_of(all.iter().map(|p| p.kind.as_str()));
    for kind in kinds {
        if !present.contains(kind) {
            bail!(
                "kinds: no prompt of kind {kind:?} in {source} (kinds there: {})",
                present.join(", ")
            );
        }
    }
    Ok(all
        .into_iter()
        .filter(|p| kinds.contains(&p.kind))
        .collect())
}

/// One line of a prompt file: `KIND<TAB>TEXT` with escapes, or plain text of kind `file`.
fn parse_line(line: &str) -> PromptText {
    if let Some((kind, text)) = line.split_once('\t') {
        let kind = kind.trim();
        // Only a word before the tab names a kind: a free-text prompt that happens to contain
        // a tab stays one prompt of kind `file`.
        let is_word = !kind.is_empty()
            && kind
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if is_word {
            return PromptText {
                kind: kind.to_owned(),
                text: unescape(text.trim()),
            };
        }
    }
    PromptText {
        kind: FILE.to_owned(),
        text: line.to_owned(),
    }
}

/// The text as a prompt file line writes it: newlines, tabs and backslashes escaped.
pub fn escape(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('\t', "\\t")
}

/// `\n`, `\t` and `\\` to a newline, a tab and a backslash; any other backslash stays.
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// The distinct kinds, in order of first appearance.
pub fn kinds_of<'a>(kinds: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for kind in kinds {
        if !out.iter().any(|k| k == kind) {
            out.push(kind.to_owned());
        }
    }
    out
}

/// The distinct kinds of a prompt set, in order of first appearance.
pub fn kinds(prompts: &[Prompt]) -> Vec<String> {
    kinds_of(prompts.iter().map(|p| p.kind.as_str()))
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
    let text: Vec<&str> = BUILT_IN.iter().map(|(_, text)| *text).collect();
    let ids = encode(&text.join("\n"))?;
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

#[cfg(test)]
mod tests {
    #[test]
    fn escaped_prompts_read_back_as_they_were() {
        for prompt in texts(None, &[]).unwrap() {
            assert_eq!(unescape(&escape(&prompt.text)), prompt.text);
        }
        let tricky = "a\\nb\tc\n\\";
        assert_eq!(unescape(&escape(tricky)), tricky);
    }

    use super::*;

    fn kinds(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn built_in_set_has_every_kind_in_order() {
        let all = texts(None, &[]).unwrap();
        assert_eq!(
            kinds_of(all.iter().map(|p| p.kind.as_str())),
            kinds(&[CODE, PROSE, EDIT])
        );
        for p in all.iter().filter(|p| p.kind == EDIT) {
            // The answer should mostly copy a snippet of 10 to 25 lines.
            let lines = p.text.lines().count();
            assert!((12..=30).contains(&lines), "{lines} lines: {}", p.text);
            assert!(p.text.contains("```"));
        }
    }

    #[test]
    fn kinds_select_and_reject_unknown() {
        let edit = texts(None, &kinds(&[EDIT])).unwrap();
        assert!(!edit.is_empty() && edit.iter().all(|p| p.kind == EDIT));
        let two = texts(None, &kinds(&[PROSE, CODE])).unwrap();
        // The built-in order is kept whatever the order of --kinds.
        assert_eq!(two.first().map(|p| p.kind.as_str()), Some(CODE));
        assert!(two.iter().all(|p| p.kind != EDIT));
        let err = texts(None, &kinds(&["poetry"])).unwrap_err().to_string();
        assert!(
            err.contains("poetry") && err.contains("code, prose, edit"),
            "{err}"
        );
    }

    #[test]
    fn file_lines_with_and_without_kind() {
        assert_eq!(
            parse_line("edit\tFix this:\\n```\\nx = 1\\n```"),
            PromptText {
                kind: "edit".into(),
                text: "Fix this:\n```\nx = 1\n```".into()
            }
        );
        assert_eq!(
            parse_line(r"Print a\\b and \d"),
            PromptText {
                kind: FILE.into(),
                text: r"Print a\\b and \d".into()
            }
        );
        assert_eq!(parse_line("two words\tthen text").kind, FILE);
        assert_eq!(parse_line(&format!("k\t{}", r"a\\n\q")).text, "a\\n\\q");
        assert_eq!(parse_line("ids\t2,17,301").text, "2,17,301");
    }
}
