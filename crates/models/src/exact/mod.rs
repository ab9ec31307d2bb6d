//! Row-exact CPU kernels.
//!
//! Speculative decoding is lossless only if verifying a block of tokens gives the very logits
//! that decoding those tokens one at a time gives. General GEMM kernels pick their blocking
//! and accumulation order from the matrix sizes, so a row's result changes with the number of
//! rows beside it. These kernels compute every output element with one fixed-order dot
//! product, so a row's result is the same whether it is alone, part of a block, or part of a
//! batch of requests. They are used on CPU for f32 blocks of a few rows (decode and verify);
//! long prefill chunks use candle's GEMM.

mod attention;
mod dot;
mod linear;

pub use attention::{exact_attention, AttentionSpan, TreeQueries};
pub use linear::exact_linear;

/// Row count up to which a linear layer or an attention block takes the exact path.
pub const EXACT_MAX_ROWS: usize = 64;
