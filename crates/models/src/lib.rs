//! Models for specd: the families of [`family::FAMILIES`] (Llama-style GGUF decoders, Gemma 4
//! and its assistant), and the loaders and kernels they share.
//!
//! The one crate of the workspace with `unsafe` code (SIMD kernels, the memory map, raw
//! pointers shared by scoped workers); every block and impl says why it holds.

#![deny(clippy::undocumented_unsafe_blocks)]

mod blocks;
pub mod causal_lm;
pub mod checkpoint;
mod config_json;
pub mod cpu;
pub mod embedding;
pub mod error;
pub mod exact;
pub mod family;
pub mod gemma4;
pub mod gemma4_assistant;
pub mod gguf;
pub mod linear;
mod precision;
pub mod projection;
pub mod qwen2;
pub mod shared_kv;
pub mod source;
#[cfg(test)]
mod test_rng;
pub mod tree;

pub use causal_lm::{top_two_with, CausalLm, OutputRows, PrefixReuse, SeqBlock, TopTwo};
pub use error::{ModelError, Result};
pub use family::{AnyCache, AnyLm, Family, LoadSpec, LoadedLm};
pub use precision::MatrixPrecision;
pub use shared_kv::{LayerKv, SharedKv};
pub use source::ModelSource;
