//! The verifier side of the round loop: the target model and its KV cache for each sequence.

use std::future::Future;

use crate::ids::SeqId;
use crate::prefix_cache::CacheScope;
use crate::sampling::{LogitRules, SamplingParams, TokenLogprob, TokenMask};

/// Prefill a new sequence and sample its first token.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillRequest {
    /// Sequence to create.
    pub seq: SeqId,
    /// Prompt token ids (not empty).
    pub prompt_ids: Vec<u32>,
    /// Kept by the verifier for every later round of the sequence.
    pub sampling: SamplingParams,
    /// Whether a drafter will need the prefill carry.
    pub want_carry: bool,
    /// Which cached prefixes the sequence may start from (and leaves its own K/V to).
    pub cache_scope: CacheScope,
    /// Bias, penalties and min-p, kept for every later round of the sequence.
    pub rules: LogitRules,
    /// Report every token's log probability with this many alternatives, in every round.
    pub top_logprobs: Option<u32>,
    /// The tokens a constraint allows as the first token.
    pub mask: Option<TokenMask>,
    /// Trailing tokens of `prompt_ids` that are already output (a sequence moved from
    /// another verifier), which the penalties count as output; 0 for a new sequence.
    pub emitted_in_prompt: usize,
}

/// Result of a prefill.
#[derive(Clone, Debug, PartialEq)]
pub struct Prefilled<C> {
    /// The first output token, sampled at output index 0. It is emitted but not yet in the
    /// cache: it is the first round's bonus token.
    pub first_token: u32,
    /// What the drafter needs to open its session (for an MTP drafter: the last prompt hidden
    /// and the shared K/V snapshot). Must be `Some` when asked for.
    pub carry: Option<C>,
    /// Prompt tokens whose K/V came from the prefix cache instead of the prefill.
    pub cached_tokens: usize,
    /// The first token's log probability, when the sequence reports them.
    pub first_logprob: Option<TokenLogprob>,
}

/// Verify one block and roll back what was not accepted, in one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyRequest {
    /// Sequence to extend.
    pub seq: SeqId,
    /// Round number, from 0. A retried `(seq, round)` must return the same answer and change
    /// nothing more.
    pub round: u32,
    /// `[bonus, d_1, .., d_{bs-1}]`: the bonus token then the drafts (only the bonus in a
    /// plain round).
    pub tokens: Vec<u32>,
    /// Most tokens this round may emit (`max_tokens - emitted`, at least `tokens.len() - 1`).
    pub budget: usize,
    /// Output index of the token after the bonus: verify slot `j` samples at index
    /// `output_index_base + j`.
    pub output_index_base: u64,
    /// Whether a drafter will need this round's carry.
    pub want_carry: bool,
    /// The tokens a constraint allows at each row (one per token); empty: unconstrained.
    pub masks: Vec<TokenMask>,
    /// The tree the drafts form (see [`crate::tree`]: draft `j`'s parent slot); empty: a
    /// chain. A tree's slot samples at `output_index_base` plus its depth.
    pub parents: Vec<u32>,
}

impl VerifyRequest {
    /// The bonus token (slot 0).
    pub fn bonus(&self) -> Option<u32> {
        self.tokens.first().copied()
    }

    /// The drafts `d_1..d_{bs-1}`.
    pub fn drafts(&self) -> &[u32] {
        self.tokens.get(1..).unwrap_or(&[])
    }
}

/// Result of a verify round, as computed by [`crate::acceptance::accept_drafts`] with the
/// target sampled by [`crate::sampling::sample`].
#[derive(Clone, Debug, PartialEq)]
pub struct Verified<C> {
    /// Drafts accepted (`a`); the cache now holds `a + 1` more positions (bonus and accepted
    /// drafts).
    pub accepted: usize,
    /// `d_1..d_a, t_a`, cut to the budget.
    pub new_tokens: Vec<u32>,
    /// What the drafter needs for its next round (for an MTP drafter: the hidden at slot `a`
    /// and the K/V rows of the `a + 1` committed positions). Must be `Some` when asked for.
    pub carry: Option<C>,
    /// The target forward this round ran in, when the verifier reports it (a replayed
    /// round ran none).
    pub forward: Option<ForwardCost>,
    /// The log probability of each of `new_tokens`, when the sequence reports them.
    pub logprobs: Vec<TokenLogprob>,
}

/// One target forward as the verifier ran it: every row of a batch shares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForwardCost {
    /// Tokens through the model, summed over the rows.
    pub tokens: usize,
    /// Rows (sequences) in the forward.
    pub rows: usize,
    /// Time of the forward alone (no queueing, no acceptance).
    pub time: std::time::Duration,
}

/// The target side: prefill, verify-and-accept, truncate and release, per sequence.
///
/// Implementations may be in-process or remote. `release` and `truncate` of an unknown or
/// released sequence should succeed, so cleanup after a failure or cancellation is safe to
/// repeat.
pub trait Verifier: Send + Sync {
    /// Opaque data the round loop hands from each verify to the drafter.
    type Carry: Send;
    /// Failure of a call; it fails the request.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Creates the sequence from the prompt and samples the first token.
    fn prefill(
        &self,
        request: PrefillRequest,
    ) -> impl Future<Output = Result<Prefilled<Self::Carry>, Self::Error>> + Send;

    /// Runs the block through the target, walks the acceptance lazily (sampling slot `j` at
    /// `output_index_base + j`), and rolls the cache back to the accepted prefix.
    fn verify(
        &self,
        request: VerifyRequest,
    ) -> impl Future<Output = Result<Verified<Self::Carry>, Self::Error>> + Send;

    /// Shrinks the cache to `committed_len` tokens (prompt included); used when a stop ends
    /// generation inside a block, so the cache holds exactly the prompt and every emitted token
    /// but the last.
    fn truncate(
        &self,
        seq: SeqId,
        committed_len: usize,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Frees the sequence.
    fn release(&self, seq: SeqId) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Frees the sequence without waiting. Called from a destructor when the request future
    /// is dropped mid-flight, so it must not block; a remote implementation typically spawns
    /// the release.
    fn release_detached(&self, seq: SeqId);
}
