//! Quantized Qwen2 (Llama family) from GGUF: the Qwen2.5-Coder target/drafter pair.
//!
//! - [`Qwen2Model`] loads a GGUF file (matmul weights stay quantized; formats with a scalar
//!   CPU kernel are re-encoded as Q8_0 once at load time) and runs blocks of tokens against a
//!   [`KvCache`] it does not own, returning logits for every position of the block. Several
//!   sequences of different lengths and positions run in one packed forward.
//! - On CPU a row's results are bit-identical whether its tokens run one at a time, as one
//!   block, or beside other rows in a batch (see `linear` and `attend` for how).
//! - [`KvCache::truncate`] rolls a sequence back after rejected draft tokens.
//! - [`Qwen2Tokenizer`] and [`ChatTemplate`] turn chat messages into token ids.

mod attend;
mod attention;
mod cache;
mod chat_template;
mod config;
mod error;
mod gguf;
mod kernels;
mod layer;
mod linear;
mod model;
mod rope;
mod tokenizer;

pub use cache::KvCache;
pub use chat_template::{ChatMessage, ChatTemplate, QWEN2_5_CHAT_TEMPLATE};
pub use config::{Qwen2Config, ARCHITECTURE};
pub use error::{Qwen2Error, Result};
pub use gguf::{has_slow_cpu_kernel, GgufFile};
pub use model::{BlockRow, LoadOptions, Qwen2Model};
pub use tokenizer::{Qwen2Tokenizer, QWEN2_SPLIT_REGEX, QWEN_STOP_TOKENS};
