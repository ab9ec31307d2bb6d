//! Stateless keyed sampling: the token at output index `k` depends only on
//! `(seed, k, logits)`, which makes speculative output identical to plain output.

mod argmax;
mod candidates;
mod keyed_uniform;
mod params;
mod sample;

pub use argmax::argmax;
pub use keyed_uniform::{keyed_u64, keyed_uniform, mix64};
pub use params::{SamplingParamError, SamplingParams};
pub use sample::{sample, SamplingError};
