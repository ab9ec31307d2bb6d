//! The text crate's tests, one binary: checkpoint directories (tokenizer, templates, stop
//! ids) and GGUF tokenizers.

mod checkpoint_text;
mod gguf_tokenizer;
