//! The n-gram drafter: one [`SuffixIndex`] per open session, behind the [`Drafter`] trait.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;

use tracing::trace;

use super::config::{NgramConfig, NgramConfigError};
use super::error::{NgramDrafterError, SessionError};
use super::index::SuffixIndex;
use crate::drafter::{DraftRequest, Drafter, OpenRequest, Opened};
use crate::ids::SessionId;
use crate::sync::lock;
use crate::tree::DraftTree;

/// Prompt-lookup drafter for any verifier: it ignores the carries and drafts from the prompt
/// and the committed tokens alone.
///
/// Sessions are independent; each has its own lock, so requests draft concurrently and a long
/// prompt is indexed without holding up the other sessions.
pub struct NgramDrafter<C> {
    config: NgramConfig,
    sessions: DashMap<SessionId, Arc<Mutex<SuffixIndex>>>,
    carry: PhantomData<fn() -> C>,
}

impl<C> NgramDrafter<C> {
    /// A drafter with no open session.
    pub fn new(config: NgramConfig) -> Result<Self, NgramConfigError> {
        config.validate()?;
        Ok(Self::with_valid_config(config))
    }

    fn with_valid_config(config: NgramConfig) -> Self {
        Self {
            config,
            sessions: DashMap::new(),
            carry: PhantomData,
        }
    }

    /// The drafter's settings.
    pub fn config(&self) -> NgramConfig {
        self.config
    }

    /// Sessions currently open.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    fn open_now(&self, session: SessionId, prompt_ids: &[u32]) -> Result<(), NgramDrafterError> {
        let mut index = SuffixIndex::new();
        index.extend(prompt_ids);
        match self.sessions.entry(session) {
            Entry::Occupied(_) => Err(SessionError::SessionExists(session).into()),
            Entry::Vacant(slot) => {
                slot.insert(Arc::new(Mutex::new(index)));
                Ok(())
            }
        }
    }

    /// The round's drafts: a tree with up to `request.tree_nodes` branch drafts where other
    /// occurrences of the matched n-gram went elsewhere, else a chain.
    fn draft_now(&self, request: &DraftRequest<C>) -> Result<DraftTree, NgramDrafterError> {
        let session = request.session;
        // The table's shard is held only for the clone of the session's handle.
        let index = self
            .sessions
            .get(&session)
            .map(|entry| entry.value().clone())
            .ok_or(SessionError::UnknownSession(session))?;
        // A panic mid-append leaves at worst a partly indexed history: drafts may get worse,
        // output never changes.
        let mut index = lock(&index);
        index.append_round(session, &request.committed_tokens, request.committed_len)?;
        let drafts = index
            .lookup_tree(
                request.bonus,
                request.count,
                request.tree_nodes,
                &self.config,
            )
            .map_or_else(DraftTree::default, |(_, tree)| tree);
        trace!(%session, round = request.round, drafted = drafts.tokens.len(), "ngram drafts");
        Ok(drafts)
    }

    fn remove(&self, session: SessionId) {
        self.sessions.remove(&session);
    }
}

impl<C> Default for NgramDrafter<C> {
    /// The drafter with [`NgramConfig::default`].
    fn default() -> Self {
        Self::with_valid_config(NgramConfig::default())
    }
}

impl<C: Send> Drafter for NgramDrafter<C> {
    type Carry = C;
    type Error = NgramDrafterError;

    fn kind(&self) -> &'static str {
        "ngram"
    }

    async fn open(&self, request: OpenRequest<C>) -> Result<Opened, NgramDrafterError> {
        self.open_now(request.session, &request.prompt_ids)?;
        // The session indexes the whole prompt.
        Ok(Opened::computed(request.prompt_ids.len()))
    }

    async fn draft(&self, request: DraftRequest<C>) -> Result<Vec<u32>, NgramDrafterError> {
        let request = DraftRequest {
            tree_nodes: 0,
            least_branch_chance: None,
            ..request
        };
        self.draft_now(&request).map(|tree| tree.tokens)
    }

    async fn draft_tree(&self, request: DraftRequest<C>) -> Result<DraftTree, NgramDrafterError> {
        self.draft_now(&request)
    }

    async fn close(&self, session: SessionId) -> Result<(), NgramDrafterError> {
        self.remove(session);
        Ok(())
    }

    fn close_detached(&self, session: SessionId) {
        self.remove(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poll_once::now;
    use crate::sampling::SamplingParams;

    /// Carries of any type are accepted and ignored; this one is not even `Clone`.
    struct OpaqueCarry;

    type TestDrafter = NgramDrafter<OpaqueCarry>;

    fn open(
        drafter: &TestDrafter,
        session: u64,
        prompt: &[u32],
    ) -> Result<Opened, NgramDrafterError> {
        now(drafter.open(OpenRequest {
            session: SessionId(session),
            prompt_ids: prompt.to_vec(),
            sampling: SamplingParams::GREEDY,
            carry: OpaqueCarry,
            cache_scope: Default::default(),
        }))
    }

    fn draft(
        drafter: &TestDrafter,
        session: u64,
        bonus: u32,
        committed_tokens: &[u32],
        committed_len: usize,
        count: usize,
    ) -> Result<Vec<u32>, NgramDrafterError> {
        now(drafter.draft(DraftRequest {
            session: SessionId(session),
            round: 0,
            bonus,
            carries: vec![OpaqueCarry],
            committed_tokens: committed_tokens.to_vec(),
            committed_len,
            output_index_base: 1,
            count,
            tree_nodes: 0,
            least_branch_chance: None,
        }))
    }

    #[test]
    fn drafts_from_the_prompt_then_from_committed_tokens() {
        let drafter = TestDrafter::default();
        open(&drafter, 1, &[1, 2, 3, 4, 1, 2]).unwrap();
        assert_eq!(draft(&drafter, 1, 3, &[], 6, 2).unwrap(), [4, 1]);
        // The bonus 3 and the accepted draft 4 entered the cache; the new bonus is 1.
        assert_eq!(draft(&drafter, 1, 1, &[3, 4], 8, 2).unwrap(), [2, 3]);
        // Nothing like 9 was seen: no drafts, and the round goes on with fewer.
        assert!(draft(&drafter, 1, 9, &[1], 9, 3).unwrap().is_empty());
    }

    #[test]
    fn a_round_that_may_branch_gets_what_followed_other_occurrences() {
        let drafter = TestDrafter::default();
        // 2 3 4 was followed by 8 9, later by 5 6.
        open(&drafter, 1, &[2, 3, 4, 8, 9, 2, 3, 4, 5, 6, 2, 3]).unwrap();
        let request = |tree_nodes| DraftRequest {
            session: SessionId(1),
            round: 1,
            bonus: 4,
            carries: vec![OpaqueCarry],
            committed_tokens: Vec::new(),
            committed_len: 12,
            output_index_base: 1,
            count: 2,
            tree_nodes,
            least_branch_chance: None,
        };
        let tree = now(drafter.draft_tree(request(3))).unwrap();
        assert_eq!(
            (tree.tokens, tree.parents),
            (vec![5, 6, 8, 9], vec![0, 1, 0, 3])
        );
        // Without branches, or through draft(), the chain of the most recent occurrence.
        assert!(now(drafter.draft_tree(request(0))).unwrap().is_chain());
        assert_eq!(now(drafter.draft(request(3))).unwrap(), [5, 6]);
    }

    #[test]
    fn sessions_are_independent() {
        let drafter = TestDrafter::default();
        open(&drafter, 1, &[4, 5, 6, 7, 4]).unwrap();
        open(&drafter, 2, &[4, 5, 8, 9, 4]).unwrap();
        assert_eq!(draft(&drafter, 1, 5, &[], 5, 2).unwrap(), [6, 7]);
        assert_eq!(draft(&drafter, 2, 5, &[], 5, 2).unwrap(), [8, 9]);
        assert_eq!(drafter.session_count(), 2);
    }

    #[test]
    fn close_and_close_detached_free_the_session() {
        let drafter = TestDrafter::default();
        open(&drafter, 1, &[1]).unwrap();
        open(&drafter, 2, &[1]).unwrap();
        now(drafter.close(SessionId(1))).unwrap();
        assert_eq!(drafter.session_count(), 1);
        drafter.close_detached(SessionId(2));
        assert_eq!(drafter.session_count(), 0);
        // Closing again, or closing what never existed, succeeds.
        now(drafter.close(SessionId(1))).unwrap();
        drafter.close_detached(SessionId(7));
        let err = draft(&drafter, 1, 1, &[], 1, 1).unwrap_err();
        assert_eq!(
            err,
            NgramDrafterError(SessionError::UnknownSession(SessionId(1)))
        );
    }

    #[test]
    fn unknown_session_error_names_it() {
        let drafter = TestDrafter::default();
        let err = draft(&drafter, 42, 1, &[], 0, 1).unwrap_err();
        assert_eq!(
            err,
            NgramDrafterError(SessionError::UnknownSession(SessionId(42)))
        );
        assert!(err.to_string().contains("session-42"), "{err}");
    }

    #[test]
    fn opening_an_open_session_fails_and_keeps_it() {
        let drafter = TestDrafter::default();
        open(&drafter, 3, &[1, 2]).unwrap();
        let err = open(&drafter, 3, &[7, 7]).unwrap_err();
        assert_eq!(
            err,
            NgramDrafterError(SessionError::SessionExists(SessionId(3)))
        );
        assert!(err.to_string().contains("session-3"), "{err}");
        assert_eq!(draft(&drafter, 3, 1, &[], 2, 1).unwrap(), [2]);
    }

    #[test]
    fn wrong_committed_len_is_rejected_without_changing_the_session() {
        let drafter = TestDrafter::default();
        open(&drafter, 1, &[1, 2, 3]).unwrap();
        let err = draft(&drafter, 1, 1, &[4], 5, 2).unwrap_err();
        assert_eq!(
            err,
            NgramDrafterError(SessionError::CommittedLenMismatch {
                session: SessionId(1),
                committed_len: 5,
                held: 3,
                sent: 1,
            })
        );
        assert!(err.to_string().contains("committed_len"), "{err}");
        // A one-token match drafts one token.
        assert_eq!(draft(&drafter, 1, 1, &[4], 4, 2).unwrap(), [2]);
        let err = draft(&drafter, 1, 1, &[], usize::MAX, 1).unwrap_err();
        assert!(matches!(
            err,
            NgramDrafterError(SessionError::CommittedLenMismatch { held: 4, .. })
        ));
    }

    #[test]
    fn invalid_config_is_rejected() {
        let err = TestDrafter::new(NgramConfig {
            min_ngram: 2,
            max_ngram: 1,
        })
        .err()
        .unwrap();
        assert_eq!(err.field, "max_ngram");
        let config = NgramConfig {
            min_ngram: 2,
            max_ngram: 4,
        };
        assert_eq!(TestDrafter::new(config).unwrap().config(), config);
    }

    #[test]
    fn drafter_is_shareable_across_tasks() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<TestDrafter>();
    }
}
