//! What a verify round hands to the drafter.

use candle_core::Tensor;
use specd_models::gemma4::SharedKv;

/// The carry of one prefill or verify round.
#[derive(Debug, Clone)]
pub struct TargetCarry {
    /// Final-normed hidden state of the last committed position `[1, hidden]`.
    pub hidden: Tensor,
    /// K/V rows the round committed (the whole snapshot after prefill), when the target
    /// exports shared K/V.
    pub shared_kv: Option<SharedKv>,
    /// Tokens the round committed to the target cache.
    pub committed: Vec<u32>,
    /// Tokens in the target cache after the round.
    pub committed_len: usize,
}
