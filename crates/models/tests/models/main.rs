//! The model crate's tests, one binary: Gemma 4 target and assistant against HF's reference
//! outputs (loading, fidelity, caches, the assistant's mirror), the Gemma 4 target and
//! assistant from GGUF files, and the Qwen2 GGUF engine on tiny random files and on the real
//! pair when it has been fetched.

mod common;
mod qwen2_support;

mod gemma4_assistant;
mod gemma4_assistant_gguf;
mod gemma4_assistant_loading;
mod gemma4_assistant_mirror;
mod gemma4_cache;
mod gemma4_fidelity;
mod gemma4_gguf;
mod gemma4_gguf_quantized;
mod gemma4_loading;
mod gemma4_trees;
mod llama_real;
mod llama_tiny;
mod qwen2_real;
mod qwen2_tiny;
mod qwen2_trees;
