//! Quantized Llama-style decoders from GGUF (Qwen2, Llama; see [`ARCHITECTURES`]): the
//! Qwen2.5-Coder target/drafter pair among them.
//!
//! - [`Qwen2Model`] loads a GGUF file (matmul weights stay in their quantized format) and
//!   runs blocks of tokens against a [`KvCache`] it does not own, returning logits (or the
//!   greedy token) for every position of the block. Several sequences of different lengths
//!   and positions run in one packed forward.
//! - On CPU it runs on the crate's own engine ([`crate::cpu`]): a row's results are
//!   bit-identical whether its tokens run one at a time, as one block, beside other rows in a
//!   batch or in a prefill chunk. Other devices run on candle.
//! - [`KvCache::truncate`] rolls a sequence back after rejected draft tokens.

mod cache;
mod candle;
mod config;
mod engine;
mod error;
mod family;
mod model;
mod rotary_rows;

pub use crate::gguf::{GgufFile, RawTensor};
pub use cache::KvCache;
pub use config::{architecture, Architecture, Qwen2Config, RotaryPairs, ARCHITECTURES};
pub use error::{Qwen2Error, Result};
pub use family::FAMILY;
pub use model::{Backend, BlockRow, EngineInfo, LoadOptions, Qwen2Model, PREFILL_CHUNK};
