//! The one record a verifier keeps per sequence: its cache, its sampling, and what the
//! protocol knows of its rounds (the last answer for a retry, the drafter mirror's window).
//! The embedded mode and the gRPC layer read and write the same record; the gRPC layer
//! only maps client ids to it and translates messages.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use specd_core::{CacheScope, LogitRules, SamplingParams, Verified, VerifyRequest};

use crate::carry::TargetCarry;
use crate::verify_block::RowShaping;

pub(crate) struct Sequence<C> {
    pub cache: C,
    /// The tokens whose K/V the cache holds (the first `cache_len` are valid: a round
    /// undone may leave more), so a finished sequence can seed the prefix cache.
    pub tokens: Vec<u32>,
    /// Leading positions computed by the prompt's prefill.
    pub prefilled: usize,
    /// Who may reuse the sequence's prefixes.
    pub scope: CacheScope,
    pub sampling: SamplingParams,
    /// Bias, penalties and min-p of every row.
    pub rules: LogitRules,
    /// Every round reports log probabilities with this many alternatives.
    pub top_logprobs: Option<u32>,
    /// The prompt's length: the tokens after it are the output the penalties count.
    pub prompt_len: usize,
    /// Rounds return carries (hidden state and shared K/V rows): set at prefill.
    pub wants_carry: bool,
    pub rounds: RoundLog,
    /// Last time a caller touched the sequence, for the expiry of idle ones.
    pub last_used: Instant,
}

impl<C> Sequence<C> {
    /// How a verify block starting at `start_len` shapes its rows: the sequence's rules, its
    /// prompt and output before the block, the block's tokens and masks.
    pub fn shaping<'a>(&'a self, request: &'a VerifyRequest, start_len: usize) -> RowShaping<'a> {
        let before = &self.tokens[..start_len.min(self.tokens.len())];
        let (prompt, output) = before.split_at(self.prompt_len.min(before.len()));
        RowShaping {
            rules: &self.rules,
            prompt,
            output,
            inputs: &request.tokens,
            masks: &request.masks,
            top_logprobs: self.top_logprobs,
        }
    }
}

/// What the protocol knows of a sequence's rounds. A round undone (its caller went away
/// during the forward) restores it whole.
#[derive(Clone, Debug)]
pub(crate) struct RoundLog {
    /// Rounds applied since prefill: the number of the last one where rounds count from 1.
    pub applied: u64,
    /// The last round answered, replayed to a retry; none after a truncate.
    pub last: Option<RoundAnswer>,
    /// First sliding row of a drafter's mirror of the shared K/V, as the prefill snapshot,
    /// a later snapshot and the rows shipped since left it.
    pub mirror_sliding_start: usize,
}

impl RoundLog {
    pub fn new(mirror_sliding_start: usize) -> Self {
        Self {
            applied: 0,
            last: None,
            mirror_sliding_start,
        }
    }
}

/// A round's answer as the sequence keeps it: enough to answer a retry the same way.
#[derive(Clone, Debug)]
pub struct RoundAnswer {
    pub round: u32,
    /// The block the round verified.
    pub tokens: Vec<u32>,
    /// The tree its drafts formed (empty: a chain).
    pub parents: Vec<u32>,
    pub verified: Verified<TargetCarry>,
    /// Tokens in the sequence before the round (the first position of its K/V rows).
    pub start_len: usize,
    /// Sliding rows a drafter's mirror drops after appending this round's rows, so that it
    /// keeps this verifier's window.
    pub sliding_evicted: usize,
}

impl RoundAnswer {
    /// Tokens in the sequence after the round.
    pub fn committed_len(&self) -> usize {
        self.start_len + self.verified.accepted + 1
    }
}

/// One sequence's record, locked by whoever runs a step of it.
pub(crate) type SequenceHandle<C> = Arc<Mutex<Sequence<C>>>;
