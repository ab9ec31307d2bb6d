//! The text crate's tests, one binary: checkpoint directories (tokenizer, templates, stop
//! ids) and GGUF tokenizers (Qwen2's byte-level BPE and Gemma 4's).

mod checkpoint_text;
mod gemma4_tokenizer;
mod gguf_tokenizer;
