//! Stateless keyed sampling: the token at output index `k` depends only on
//! `(seed, k, logits)`, which makes speculative output identical to plain output.

mod argmax;
mod candidates;
mod keyed_uniform;
mod logit_rules;
mod logprobs;
mod params;
mod sample;
mod token_mask;

pub use argmax::argmax;
pub use keyed_uniform::{keyed_u64, keyed_uniform, mix64};
pub use logit_rules::{LogitRuleError, LogitRules, PenaltyContext};
pub use logprobs::{token_logprob, TokenLogprob, MAX_TOP_LOGPROBS};
pub use params::{SamplingParamError, SamplingParams};
pub use sample::{sample, SamplingError};
pub use token_mask::{EmptyMask, TokenMask};
