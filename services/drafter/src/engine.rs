//! What a drafter runs: the [`DraftEngine`] trait and the data it is handed.
//!
//! The server owns the protocol (sessions, rounds, retries, validation of the wire); an engine
//! owns the model. Every engine method is called on tokio's blocking pool and may compute.
//! Engines see model-side types only: the server turns wire messages into them
//! ([`crate::wire_kv`]), and the embedded mode hands the verifier's K/V over as it is.

use candle_core::{Device, Tensor};
use specd_core::prefix_cache::PrefixCacheTotals;
use specd_core::{CacheScope, DraftTree, SamplingParams};
pub use specd_models::gemma4::{LayerKv, SharedKv};
use specd_wire::drafter::DrafterKind;

use crate::tree_growth::Branching;

/// What a drafter reports about itself in Stats and checks requests against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInfo {
    /// Which carry the engine needs each round.
    pub kind: DrafterKind,
    /// Identifies the loaded drafter model.
    pub model: String,
    /// Largest `count` one Draft may ask for.
    pub max_draft_tokens: usize,
    /// Vocabulary size shared with the target; bonus tokens must be below it.
    pub vocab_size: usize,
}

/// Where a session starts from.
#[derive(Debug, Clone)]
pub enum SessionSource {
    /// MTP: the target's shared K/V at the committed length; the full-attention rows start at
    /// position 0 and end at the committed length.
    Snapshot(SharedKv),
    /// Draft model: every token in the target cache, in order.
    Context(Vec<u32>),
}

/// A session to open.
#[derive(Debug, Clone)]
pub struct OpenSession {
    /// Sampling of the sequence; drafts at output index `k` may draw with key `(seed, k)`.
    pub sampling: SamplingParams,
    /// Tokens in the target cache.
    pub committed_len: usize,
    pub source: SessionSource,
    /// Which cached prefixes the session may open from and leaves its own to.
    pub cache_scope: CacheScope,
}

/// The K/V rows one verify round committed, in the model's layout: each layer's rows
/// `[kv_heads, rows, head_dim]` start at the committed length before the round.
#[derive(Debug, Clone)]
pub struct CommittedKv {
    pub rows: SharedKv,
    /// Sliding rows the verifier dropped from the front of its window after appending these.
    /// The assistant's mirror keeps its own window and need not follow it.
    pub sliding_evicted: usize,
}

impl CommittedKv {
    /// Absolute position of the first row.
    pub fn start_position(&self) -> usize {
        self.rows.full.start
    }

    /// Rows (committed positions) it carries.
    pub fn rows(&self) -> usize {
        self.rows.full.rows()
    }
}

/// The state of the last verify round, applied before drafting.
#[derive(Debug, Clone)]
pub enum DraftCarry {
    /// MTP: the final-normed target hidden state at the last committed position `[1, H]`
    /// and the K/V rows the round committed (none for the first round after open).
    Mtp {
        hidden: Tensor,
        delta: Option<CommittedKv>,
    },
    /// Draft model: the tokens the round committed (none for the first round after open).
    Tokens(Vec<u32>),
}

impl DraftCarry {
    /// Positions this carry adds to the session's committed length.
    pub fn committed_rows(&self) -> usize {
        match self {
            DraftCarry::Mtp { delta, .. } => delta.as_ref().map_or(0, CommittedKv::rows),
            DraftCarry::Tokens(tokens) => tokens.len(),
        }
    }
}

/// One draft step, after the carry is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftStep {
    /// The last emitted token, at position `committed_len` (not in the target cache).
    pub bonus: u32,
    /// Position of the last committed token (`committed_len - 1`): the query position.
    pub position: usize,
    /// Drafts wanted, `1..=max_draft_tokens`.
    pub count: usize,
    /// Output index of the first draft.
    pub output_index_base: u64,
    /// Rejection branches the pre-draft after this draft prepares besides the
    /// all-accepted one (0: none; engines that do not branch ignore it).
    pub branches: usize,
}

/// An engine failed; the server maps the kind to a status code.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The input does not fit the engine (wrong shapes, dtypes, kinds): INVALID_ARGUMENT.
    #[error("{field}: {reason}")]
    InvalidInput { field: String, reason: String },
    /// The input does not line up with the session state: FAILED_PRECONDITION.
    #[error("{field}: {reason}")]
    Mismatch { field: String, reason: String },
    /// The engine itself failed: INTERNAL.
    #[error("drafter engine: {0}")]
    Internal(String),
}

impl EngineError {
    pub fn invalid(field: &str, reason: impl Into<String>) -> Self {
        Self::InvalidInput {
            field: field.to_owned(),
            reason: reason.into(),
        }
    }

    pub fn mismatch(field: &str, reason: impl Into<String>) -> Self {
        Self::Mismatch {
            field: field.to_owned(),
            reason: reason.into(),
        }
    }
}

impl From<candle_core::Error> for EngineError {
    fn from(error: candle_core::Error) -> Self {
        Self::Internal(error.to_string())
    }
}

/// A drafter model: opens per-session state and drafts from it.
///
/// The session state is all a drafter keeps per request: for an MTP engine, mirrors of the
/// target's shared K/V and the last hidden state; for a draft model, its own KV cache.
pub trait DraftEngine: Send + Sync + 'static {
    type Session: Send + 'static;

    fn info(&self) -> EngineInfo;

    /// Device the engine computes on; carry tensors are decoded onto it.
    fn device(&self) -> &Device;

    /// Builds a session; `open.source` matches [`EngineInfo::kind`].
    fn open(&self, open: OpenSession) -> Result<Self::Session, EngineError>;

    /// Tokens in the target cache as far as the session knows.
    fn committed_len(&self, session: &Self::Session) -> usize;

    /// Context positions a session just opened computed or received, for pricing opens: by
    /// default every position it holds (a snapshot brings them all).
    fn computed_at_open(&self, session: &Self::Session) -> usize {
        self.committed_len(session)
    }

    /// Applies the carry of the last round. The server has checked that the carry kind
    /// matches and that it continues the session (`start_position == committed_len`).
    fn apply(&self, session: &mut Self::Session, carry: DraftCarry) -> Result<(), EngineError>;

    /// Proposes up to `step.count` tokens after the bonus (fewer when it stops early).
    fn draft(&self, session: &mut Self::Session, step: DraftStep) -> Result<Vec<u32>, EngineError>;

    /// [`Self::draft`] as a token tree: the drafts, and up to `branching.nodes` more
    /// beside them where the engine sees alternatives at least as likely as
    /// `branching.least_chance`. An engine that does not branch drafts a chain.
    fn draft_tree(
        &self,
        session: &mut Self::Session,
        step: DraftStep,
        branching: Branching,
    ) -> Result<DraftTree, EngineError> {
        let _ = branching;
        self.draft(session, step).map(DraftTree::chain)
    }

    /// [`Self::draft`] for several sessions at once, answers in their order. An engine
    /// that can runs every session's draft steps in one packed forward per step; the
    /// drafts are the same as one session at a time.
    fn draft_many(
        &self,
        jobs: &mut [(&mut Self::Session, DraftStep)],
    ) -> Vec<Result<Vec<u32>, EngineError>> {
        jobs.iter_mut()
            .map(|(session, step)| self.draft(session, *step))
            .collect()
    }

    /// [`Self::predraft_step`] for several sessions at once (each with its own `count`),
    /// answers in their order; in one packed forward where the engine can.
    fn predraft_many(
        &self,
        jobs: &mut [(&mut Self::Session, usize)],
    ) -> Vec<Result<bool, EngineError>> {
        jobs.iter_mut()
            .map(|(session, count)| self.predraft_step(session, *count))
            .collect()
    }

    /// Pre-drafts the next round one more token while the target verifies this one,
    /// assuming every draft is accepted and the target's next token is the drafter's own: up
    /// to `count + 1` tokens (that token and `count` drafts after it). With
    /// [`DraftStep::branches`], the same step also pre-drafts that many likely rejections
    /// (the drafts up to a point accepted, then the drafter's runner-up there), in the same
    /// forward. `Ok(false)` once there is nothing more to do, or when the engine does not
    /// pre-draft (an MTP drafter needs the verify's hidden state).
    fn predraft_step(
        &self,
        _session: &mut Self::Session,
        _count: usize,
    ) -> Result<bool, EngineError> {
        Ok(false)
    }

    /// Whether the last [`DraftEngine::draft`] started from the pre-draft (the target's next
    /// token was the one the drafter pre-drafted after).
    fn predraft_hit(&self, _session: &Self::Session) -> bool {
        false
    }

    /// Whether that pre-draft was a rejection branch (the target rejected a draft and
    /// emitted the token the branch assumed).
    fn predraft_branch_hit(&self, _session: &Self::Session) -> bool {
        false
    }

    /// Ends a session; an engine with a prefix cache keeps its state for later sessions.
    fn close(&self, _session: Self::Session) {}

    /// The engine's prefix cache, where it keeps one.
    fn prefix_cache(&self) -> Option<PrefixCacheView> {
        None
    }
}

/// What a prefix cache holds and did, for Stats and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheView {
    pub bytes: usize,
    pub capacity_bytes: usize,
    pub totals: PrefixCacheTotals,
}
