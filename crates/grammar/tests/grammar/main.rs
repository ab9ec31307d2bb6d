//! specd-grammar on real vocabularies: the Gemma 4-style fixture always, the real
//! Qwen2.5-Coder vocabulary when its GGUF has been fetched.

mod support;

mod block_masks;
mod errors;
mod forced;
mod json_schema;
mod regex_and_lark;
mod robustness;
mod token_bytes;
