//! The drafter side of the round loop: proposes the next tokens of a sequence.

use std::future::Future;
use std::marker::PhantomData;

use crate::ids::SessionId;
use crate::prefix_cache::CacheScope;
use crate::sampling::SamplingParams;
use crate::tree::DraftTree;

/// Open a drafter session for a freshly prefilled sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenRequest<C> {
    /// Session to create.
    pub session: SessionId,
    /// Prompt token ids (what the target cache holds after prefill).
    pub prompt_ids: Vec<u32>,
    /// The request's sampling; drafting with the same keyed sampler at the same output indices
    /// couples drafts to the target's draws.
    pub sampling: SamplingParams,
    /// The verifier's prefill carry.
    pub carry: C,
    /// Which cached prefixes a drafter with a prefix cache may open the session from.
    pub cache_scope: CacheScope,
}

/// What opening a session took in, for pricing later opens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Opened {
    /// Context positions the drafter computed or received to open: for a draft model the
    /// prompt tokens its own prefix cache did not hold, for an MTP drafter the snapshot's
    /// positions. `None`: the drafter did not say; its open is then priced on the whole
    /// prompt.
    pub computed: Option<usize>,
}

impl Opened {
    /// A session that computed or received `positions` context positions.
    pub fn computed(positions: usize) -> Self {
        Self {
            computed: Some(positions),
        }
    }
}

/// Draft the next tokens after the bonus.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftRequest<C> {
    /// Session to draft for.
    pub session: SessionId,
    /// Round number (the verify round these drafts are for).
    pub round: u32,
    /// The last emitted token, not yet in the target cache.
    pub bonus: u32,
    /// Verifier carries of the rounds since the previous draft call, oldest first (empty on
    /// the first call after open). Apply them in order.
    pub carries: Vec<C>,
    /// Tokens that entered the target cache since the previous draft call (or since open),
    /// in order: each round's bonus and accepted drafts.
    pub committed_tokens: Vec<u32>,
    /// Tokens in the target cache, prompt included, once those are applied; the bonus sits
    /// at this position.
    pub committed_len: usize,
    /// Output index of the first draft (`d_1` guesses the token at this index).
    pub output_index_base: u64,
    /// Drafts wanted (`bs - 1`). Fewer is allowed (a plain round if none); more is an error.
    pub count: usize,
    /// Drafts a tree may add beside the `count` deepest ones (0: a chain); see
    /// [`Drafter::draft_tree`].
    pub tree_nodes: usize,
    /// The least chance of being committed that makes a branch draft worth its verify row,
    /// as the round loop prices rows from what its rounds cost; `None`: the drafter's own.
    pub least_branch_chance: Option<f64>,
}

/// The drafter side: per-session state that turns the bonus into draft tokens.
///
/// Drafts only change speed, never output: any failure makes the request continue without
/// speculation. `close` of an unknown or closed session should succeed.
pub trait Drafter: Send + Sync {
    /// Opaque data produced by the verifier each round (see [`crate::verifier::Verifier`]).
    type Carry: Send;
    /// Failure of a call; it ends speculation for the request, not the request.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Creates the session from the prefill carry.
    fn open(
        &self,
        request: OpenRequest<Self::Carry>,
    ) -> impl Future<Output = Result<Opened, Self::Error>> + Send;

    /// Applies the pending carries, then drafts up to `count` tokens after the bonus.
    fn draft(
        &self,
        request: DraftRequest<Self::Carry>,
    ) -> impl Future<Output = Result<Vec<u32>, Self::Error>> + Send;

    /// [`Self::draft`] as a tree of at most `count` levels and `count + tree_nodes` drafts
    /// (the drafter's likeliest alternatives beside its first choices). A drafter that does
    /// not branch drafts a chain.
    fn draft_tree(
        &self,
        request: DraftRequest<Self::Carry>,
    ) -> impl Future<Output = Result<DraftTree, Self::Error>> + Send {
        let draft = self.draft(request);
        async move { draft.await.map(DraftTree::chain) }
    }

    /// Frees the session.
    fn close(&self, session: SessionId) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Frees the session without waiting. Called from a destructor or after a failure, so it
    /// must not block; a remote implementation typically spawns the close.
    fn close_detached(&self, session: SessionId);
    /// Short stable label of this kind of drafter, for metrics (`specd_rounds_total`).
    fn kind(&self) -> &'static str {
        "model"
    }
}

/// The drafter type of a loop that never drafts. Every call but close fails.
pub struct NoDrafter<C>(PhantomData<fn() -> C>);

impl<C> Default for NoDrafter<C> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

/// [`NoDrafter`] was asked to draft.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no drafter is configured")]
pub struct NoDrafterError;

impl<C: Send> Drafter for NoDrafter<C> {
    type Carry = C;
    type Error = NoDrafterError;

    async fn open(&self, _request: OpenRequest<C>) -> Result<Opened, NoDrafterError> {
        Err(NoDrafterError)
    }

    async fn draft(&self, _request: DraftRequest<C>) -> Result<Vec<u32>, NoDrafterError> {
        Err(NoDrafterError)
    }

    async fn close(&self, _session: SessionId) -> Result<(), NoDrafterError> {
        Ok(())
    }

    fn close_detached(&self, _session: SessionId) {}
}
