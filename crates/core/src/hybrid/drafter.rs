//! The hybrid drafter: a suffix index per session in front of an inner drafter.

use std::sync::{Arc, Mutex};

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;

use tracing::trace;

use super::error::HybridDrafterError;
use crate::drafter::{DraftRequest, Drafter, OpenRequest, Opened};
use crate::ids::SessionId;
use crate::ngram::SessionError;
use crate::ngram::{NgramConfig, NgramConfigError, SuffixIndex};
use crate::sync::lock;
use crate::tree::DraftTree;

/// The lookup of [`HybridDrafter::with_default_lookup`]: a match of 4 tokens or more drafts,
/// as many tokens as it is long, and from 8 tokens on the full count. Four BPE tokens (about
/// three words, or an identifier and its punctuation) rarely recur by chance, while one to
/// three do all the time, and there a draft model guesses better than a coincidental copy.
pub const HYBRID_LOOKUP: NgramConfig = NgramConfig {
    min_ngram: 4,
    max_ngram: 8,
};

/// Rounds the inner drafter may fall behind: a round that would leave it further behind goes
/// to it whatever the lookup finds. The inner session catches up on every skipped round at
/// its next call (an MTP drafter applies their K/V rows, a draft model runs their tokens), so
/// an unbounded streak through a long copy would turn that call into one latency spike and,
/// over the wire, one oversized message.
pub const MAX_SKIPPED_ROUNDS: usize = 16;

/// One session: the index over its context, and what the inner session has not seen yet.
struct Session<C> {
    index: SuffixIndex,
    /// Carries of the rounds drafted by lookup since the inner drafter's last call, oldest
    /// first.
    carries: Vec<C>,
    /// Tokens committed in those rounds, in order.
    committed: Vec<u32>,
}

/// Open sessions, each behind its own lock.
type Sessions<C> = DashMap<SessionId, Arc<Mutex<Session<C>>>>;

/// What a draft call does once the session's index has taken in the request.
enum Route<C> {
    /// Lookup drafts: a chain, or a tree where the round may branch.
    Lookup(DraftTree),
    Inner(DraftRequest<C>),
}

/// Prompt lookup for rounds whose context repeats earlier text, the inner drafter `D` for the
/// others (see the [module](super) docs).
///
/// Sessions are independent; each has its own lock, held only while the index is updated
/// and never across a call to the inner drafter.
pub struct HybridDrafter<D: Drafter> {
    inner: D,
    lookup: NgramConfig,
    sessions: Sessions<D::Carry>,
}

impl<D: Drafter> HybridDrafter<D> {
    /// `inner` behind a lookup with `lookup`'s settings: its `min_ngram` is the match length
    /// from which lookup drafts instead of `inner`.
    pub fn new(inner: D, lookup: NgramConfig) -> Result<Self, NgramConfigError> {
        lookup.validate()?;
        Ok(Self {
            inner,
            lookup,
            sessions: DashMap::new(),
        })
    }

    /// `inner` behind the lookup of [`HYBRID_LOOKUP`].
    pub fn with_default_lookup(inner: D) -> Self {
        Self {
            inner,
            lookup: HYBRID_LOOKUP,
            sessions: DashMap::new(),
        }
    }

    /// The inner drafter.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The lookup's settings.
    pub fn lookup(&self) -> NgramConfig {
        self.lookup
    }

    /// Sessions currently open.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    fn check_new(&self, session: SessionId) -> Result<(), HybridDrafterError<D::Error>> {
        if self.sessions.contains_key(&session) {
            return Err(SessionError::SessionExists(session).into());
        }
        Ok(())
    }

    fn insert(
        &self,
        session: SessionId,
        index: SuffixIndex,
    ) -> Result<(), HybridDrafterError<D::Error>> {
        match self.sessions.entry(session) {
            Entry::Occupied(_) => Err(SessionError::SessionExists(session).into()),
            Entry::Vacant(slot) => {
                slot.insert(Arc::new(Mutex::new(Session {
                    index,
                    carries: Vec::new(),
                    committed: Vec::new(),
                })));
                Ok(())
            }
        }
    }

    /// Takes the request into the session's index and decides who drafts. A request for the
    /// inner drafter carries every round it has not seen, oldest first.
    fn route(
        &self,
        request: DraftRequest<D::Carry>,
    ) -> Result<Route<D::Carry>, HybridDrafterError<D::Error>> {
        let DraftRequest {
            session,
            round,
            bonus,
            carries,
            committed_tokens,
            committed_len,
            output_index_base,
            count,
            tree_nodes,
            least_branch_chance,
        } = request;
        // The table's shard is held only for the clone of the session's handle.
        let entry = self
            .sessions
            .get(&session)
            .map(|entry| entry.value().clone())
            .ok_or(SessionError::UnknownSession(session))?;
        // A panic mid-update leaves at worst a partly indexed history or a partial backlog:
        // the inner drafter then rejects its `committed_len` and the request goes on plain.
        let mut state = lock(&entry);
        state
            .index
            .append_round(session, &committed_tokens, committed_len)?;
        state.carries.extend(carries);
        state.committed.extend(committed_tokens);
        let streak_left = state.carries.len() <= MAX_SKIPPED_ROUNDS;
        let lookup = streak_left
            .then(|| {
                state
                    .index
                    .lookup_tree(bonus, count, tree_nodes, &self.lookup)
            })
            .flatten();
        if let Some((found, drafts)) = lookup {
            trace!(%session, round, matched = found.len, drafted = drafts.tokens.len(), "lookup drafts");
            return Ok(Route::Lookup(drafts));
        }
        trace!(%session, round, rounds = state.carries.len(), "inner drafter drafts");
        Ok(Route::Inner(DraftRequest {
            session,
            round,
            bonus,
            carries: std::mem::take(&mut state.carries),
            committed_tokens: std::mem::take(&mut state.committed),
            committed_len,
            output_index_base,
            count,
            tree_nodes,
            least_branch_chance,
        }))
    }

    fn remove(&self, session: SessionId) {
        self.sessions.remove(&session);
    }
}

impl<D: Drafter> Drafter for HybridDrafter<D> {
    type Carry = D::Carry;
    type Error = HybridDrafterError<D::Error>;

    fn kind(&self) -> &'static str {
        "hybrid"
    }

    /// Opens the inner session too; when that fails, so does this open (and the request
    /// runs plain), as lookup alone is a different drafter from the one configured.
    async fn open(&self, request: OpenRequest<D::Carry>) -> Result<Opened, Self::Error> {
        let session = request.session;
        self.check_new(session)?;
        let mut index = SuffixIndex::new();
        index.extend(&request.prompt_ids);
        // The inner open is what costs: indexing the prompt is cheap beside it.
        let opened = self
            .inner
            .open(request)
            .await
            .map_err(HybridDrafterError::Inner)?;
        self.insert(session, index)?;
        Ok(opened)
    }

    async fn draft(&self, request: DraftRequest<D::Carry>) -> Result<Vec<u32>, Self::Error> {
        match self.route(request)? {
            Route::Lookup(drafts) => Ok(drafts.tokens),
            Route::Inner(request) => self
                .inner
                .draft(request)
                .await
                .map_err(HybridDrafterError::Inner),
        }
    }

    /// Lookup branches where other occurrences of its n-gram went elsewhere; the inner
    /// drafter where it can.
    async fn draft_tree(&self, request: DraftRequest<D::Carry>) -> Result<DraftTree, Self::Error> {
        match self.route(request)? {
            Route::Lookup(drafts) => Ok(drafts),
            Route::Inner(request) => self
                .inner
                .draft_tree(request)
                .await
                .map_err(HybridDrafterError::Inner),
        }
    }

    async fn close(&self, session: SessionId) -> Result<(), Self::Error> {
        self.remove(session);
        self.inner
            .close(session)
            .await
            .map_err(HybridDrafterError::Inner)
    }

    fn close_detached(&self, session: SessionId) {
        self.remove(session);
        self.inner.close_detached(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poll_once::now;
    use crate::sampling::SamplingParams;
    use std::sync::MutexGuard;

    #[derive(Debug, PartialEq, Eq, thiserror::Error)]
    #[error("inner failed")]
    struct InnerError;

    /// An inner drafter that records what it is sent and drafts `[900 + round]`.
    #[derive(Default)]
    struct Recorder {
        fail_open: bool,
        log: Mutex<Log>,
    }

    #[derive(Default)]
    struct Log {
        opens: Vec<(SessionId, Vec<u32>, &'static str)>,
        /// `(round, carries, committed_tokens, committed_len)` of each draft call.
        drafts: Vec<(u32, Vec<&'static str>, Vec<u32>, usize)>,
        closed: Vec<SessionId>,
        detached: Vec<SessionId>,
    }

    impl Recorder {
        fn log(&self) -> MutexGuard<'_, Log> {
            self.log.lock().unwrap()
        }
    }

    impl Drafter for Recorder {
        type Carry = &'static str;
        type Error = InnerError;

        async fn open(&self, request: OpenRequest<&'static str>) -> Result<Opened, InnerError> {
            if self.fail_open {
                return Err(InnerError);
            }
            let computed = request.prompt_ids.len();
            self.log()
                .opens
                .push((request.session, request.prompt_ids, request.carry));
            Ok(Opened::computed(computed))
        }

        async fn draft(&self, request: DraftRequest<&'static str>) -> Result<Vec<u32>, InnerError> {
            self.log().drafts.push((
                request.round,
                request.carries,
                request.committed_tokens,
                request.committed_len,
            ));
            Ok(vec![900 + request.round])
        }

        async fn close(&self, session: SessionId) -> Result<(), InnerError> {
            self.log().closed.push(session);
            Ok(())
        }

        fn close_detached(&self, session: SessionId) {
            self.log().detached.push(session);
        }
    }

    type TestDrafter = HybridDrafter<Recorder>;

    fn open(drafter: &TestDrafter, session: u64, prompt: &[u32]) -> Result<Opened, TestError> {
        now(drafter.open(OpenRequest {
            session: SessionId(session),
            prompt_ids: prompt.to_vec(),
            sampling: SamplingParams::GREEDY,
            carry: "prefill",
            cache_scope: Default::default(),
        }))
    }

    type TestError = HybridDrafterError<InnerError>;

    /// Round `round` of session 1: `committed` entered the cache under carry `carry`.
    fn draft(
        drafter: &TestDrafter,
        round: u32,
        carry: &'static str,
        committed: &[u32],
        committed_len: usize,
        bonus: u32,
        count: usize,
    ) -> Result<Vec<u32>, TestError> {
        now(drafter.draft(DraftRequest {
            session: SessionId(1),
            round,
            bonus,
            carries: vec![carry],
            committed_tokens: committed.to_vec(),
            committed_len,
            output_index_base: 0,
            count,
            tree_nodes: 0,
            least_branch_chance: None,
        }))
    }

    /// A prompt with a 10-token block in it, and a drafter opened on it.
    fn opened() -> (TestDrafter, Vec<u32>) {
        let prompt: Vec<u32> = (10..20).chain([5, 6]).collect();
        let drafter = TestDrafter::with_default_lookup(Recorder::default());
        open(&drafter, 1, &prompt).unwrap();
        (drafter, prompt)
    }

    #[test]
    fn long_matches_draft_by_lookup_short_ones_go_inside() {
        let (drafter, _) = opened();
        assert_eq!(drafter.kind(), "hybrid");
        assert_eq!(drafter.inner().log().opens.len(), 1);
        // Context ... 5 6 | 10: a one-token match; the inner drafter drafts.
        assert_eq!(draft(&drafter, 1, "r0", &[], 12, 10, 3).unwrap(), [901]);
        // Context ... 10 11 12 | 13: four tokens of the block; lookup drafts 14 15 16.
        assert_eq!(
            draft(&drafter, 2, "r1", &[10, 11, 12], 15, 13, 3).unwrap(),
            [14, 15, 16]
        );
        assert_eq!(drafter.inner().log().drafts.len(), 1);
    }

    /// Where the round may branch and the matched n-gram occurred before with another
    /// follower, lookup drafts a tree; the inner drafter's chains come through as trees.
    #[test]
    fn lookup_branches_where_the_context_went_elsewhere_before() {
        // 0 1 2 3 4 (a match long enough for lookup) was followed by 8 9, later by 5 6.
        let prompt = [0, 1, 2, 3, 4, 8, 9, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3];
        let drafter = TestDrafter::with_default_lookup(Recorder::default());
        open(&drafter, 1, &prompt).unwrap();
        let tree = now(drafter.draft_tree(DraftRequest {
            session: SessionId(1),
            round: 1,
            bonus: 4,
            carries: vec!["r0"],
            committed_tokens: Vec::new(),
            committed_len: prompt.len(),
            output_index_base: 0,
            count: 2,
            tree_nodes: 2,
            least_branch_chance: None,
        }))
        .unwrap();
        assert_eq!(tree.tokens, [5, 6, 8, 9]);
        assert_eq!(tree.parents, [0, 1, 0, 3]);
        assert!(drafter.inner().log().drafts.is_empty());
    }

    #[test]
    fn skipped_rounds_reach_the_inner_drafter_in_order() {
        let (drafter, _) = opened();
        assert_eq!(draft(&drafter, 1, "r0", &[], 12, 10, 3).unwrap(), [901]);
        // Two lookup rounds: matches of 4 and then 8 tokens.
        assert_eq!(
            draft(&drafter, 2, "r1", &[10, 11, 12], 15, 13, 3).unwrap(),
            [14, 15, 16]
        );
        assert_eq!(
            draft(&drafter, 3, "r2", &[13, 14, 15, 16], 19, 17, 2).unwrap(),
            [18, 19]
        );
        // The output leaves the block: context ... 17 | 40 matches nothing.
        assert_eq!(draft(&drafter, 4, "r3", &[17], 20, 40, 3).unwrap(), [904]);
        let log = drafter.inner().log();
        assert_eq!(log.drafts.len(), 2);
        assert_eq!(log.drafts[0], (1, vec!["r0"], vec![], 12));
        assert_eq!(
            log.drafts[1],
            (
                4,
                vec!["r1", "r2", "r3"],
                vec![10, 11, 12, 13, 14, 15, 16, 17],
                20
            )
        );
    }

    #[test]
    fn a_long_lookup_streak_hands_one_round_inside() {
        // A prompt of one repeated token: every round matches at full length.
        let drafter = TestDrafter::with_default_lookup(Recorder::default());
        open(&drafter, 1, &[7; 40]).unwrap();
        let mut committed_len = 40;
        let mut inner_rounds = Vec::new();
        for round in 1..=40 {
            let committed: &[u32] = if round == 1 { &[] } else { &[7, 7] };
            committed_len += committed.len();
            let drafts = draft(&drafter, round, "r", committed, committed_len, 7, 1).unwrap();
            if drafts != [7] {
                inner_rounds.push(round);
            }
        }
        // MAX_SKIPPED_ROUNDS lookup rounds, then one inner round that catches up on them.
        let period = MAX_SKIPPED_ROUNDS as u32 + 1;
        assert_eq!(inner_rounds, [period, 2 * period]);
        let log = drafter.inner().log();
        assert_eq!(log.drafts[0].1.len(), MAX_SKIPPED_ROUNDS + 1);
        assert_eq!(log.drafts[0].3, 40 + 2 * MAX_SKIPPED_ROUNDS);
    }

    #[test]
    fn committed_len_mismatch_is_rejected_without_changing_the_session() {
        let (drafter, _) = opened();
        let err = draft(&drafter, 1, "r0", &[10], 14, 11, 3).unwrap_err();
        assert!(matches!(
            err,
            HybridDrafterError::Session(SessionError::CommittedLenMismatch {
                held: 12,
                sent: 1,
                committed_len: 14,
                ..
            })
        ));
        assert!(err.to_string().contains("committed_len"), "{err}");
        assert_eq!(draft(&drafter, 1, "r0", &[10], 13, 11, 3).unwrap(), [901]);
        assert_eq!(drafter.inner().log().drafts[0].1, ["r0"]);
    }

    #[test]
    fn a_failed_inner_open_fails_the_open() {
        let drafter = TestDrafter::with_default_lookup(Recorder {
            fail_open: true,
            ..Recorder::default()
        });
        let err = open(&drafter, 1, &[1, 2, 3]).unwrap_err();
        assert!(matches!(err, HybridDrafterError::Inner(InnerError)));
        assert_eq!(drafter.session_count(), 0);
        let err = draft(&drafter, 1, "r0", &[], 3, 1, 2).unwrap_err();
        assert!(matches!(
            err,
            HybridDrafterError::Session(SessionError::UnknownSession(SessionId(1)))
        ));
    }

    #[test]
    fn opening_an_open_session_fails_and_keeps_it() {
        let (drafter, prompt) = opened();
        let err = open(&drafter, 1, &[1]).unwrap_err();
        assert!(err.to_string().contains("session-1"), "{err}");
        assert_eq!(
            drafter.inner().log().opens,
            [(SessionId(1), prompt, "prefill")]
        );
        assert_eq!(drafter.session_count(), 1);
    }

    #[test]
    fn close_and_close_detached_reach_the_inner_drafter() {
        let (drafter, _) = opened();
        open(&drafter, 2, &[1]).unwrap();
        now(drafter.close(SessionId(1))).unwrap();
        drafter.close_detached(SessionId(2));
        assert_eq!(drafter.session_count(), 0);
        let log = drafter.inner().log();
        assert_eq!(log.closed, [SessionId(1)]);
        assert_eq!(log.detached, [SessionId(2)]);
    }

    #[test]
    fn invalid_lookup_is_rejected() {
        let bad = NgramConfig {
            min_ngram: 0,
            max_ngram: 4,
        };
        let err = TestDrafter::new(Recorder::default(), bad).err().unwrap();
        assert_eq!(err.field, "min_ngram");
        let lookup = NgramConfig {
            min_ngram: 2,
            max_ngram: 2,
        };
        let drafter = TestDrafter::new(Recorder::default(), lookup).unwrap();
        assert_eq!(drafter.lookup(), lookup);
    }

    #[test]
    fn drafter_is_shareable_across_tasks() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<TestDrafter>();
    }
}
