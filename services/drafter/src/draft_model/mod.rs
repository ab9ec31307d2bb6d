//! The `draft-model` kind: an independent small LM (any [`CausalLm`]; from the command line,
//! any family the registry lets draft as one) with its own KV cache per session. Each round
//! ships only the committed tokens; the cache keeps what the drafter fed
//! last round where it agrees with them and is rolled back past the first rejection.

use candle_core::Device;
use specd_core::{CacheScope, DraftTree, PrefixCache, PrefixRule};
use specd_models::qwen2::Qwen2Model;
use specd_models::{AnyLm, CausalLm, LoadSpec, ModelSource, OutputRows, SeqBlock, TopTwo};
use specd_wire::drafter::DrafterKind;

use crate::engine::{
    DraftCarry, DraftEngine, DraftStep, EngineError, EngineInfo, OpenSession, PrefixCacheView,
    SessionSource,
};
use crate::tree_growth::Branching;

mod branches;
mod tree_draft;

use branches::{Branch, Ranked, SpareCache};

/// Token ids a draft model proposes from by default: the first 65,536. BPE vocabularies
/// number their tokens in merge order, so the ids past this are rare words and pieces (under
/// 2% of the tokens of the real pair's code and prose outputs), while their rows are more than
/// half of the 0.5B drafter's 152k-row LM head and a fifth of the bytes its step reads.
/// Drafts only change speed: a token the drafter cannot propose is still emitted, by the
/// target, at the end of a round.
pub const DEFAULT_DRAFT_VOCAB: usize = 65_536;

pub struct DraftModelEngine<M: CausalLm = Qwen2Model> {
    model: M,
    name: String,
    max_draft_tokens: usize,
    /// Drafts are the greedy token among ids below this.
    draft_vocab: usize,
    /// Closed sessions' caches, which later sessions whose context starts the same way open
    /// from (a conversation's next turn prefills only its new tokens).
    prefixes: PrefixCache<M::Cache>,
}

pub struct DraftModelSession<C = specd_models::qwen2::KvCache> {
    cache: C,
    /// The target's committed tokens, in order: the first `committed_len - pending.len()`
    /// are in the cache.
    context: Vec<u32>,
    /// Who may open from this session's cache once it is closed.
    scope: CacheScope,
    /// Tokens in the target cache.
    committed_len: usize,
    /// Context tokens the open prefilled: those no cached prefix held.
    prefilled_at_open: usize,
    /// Committed tokens not yet in the drafter's cache.
    pending: Vec<u32>,
    /// Tokens the drafter fed after `committed_len` last round (the bonus and its drafts,
    /// then what the pre-draft fed).
    speculated: Vec<u32>,
    /// The last round's drafts with their runner-ups (runner-ups only when it was asked to
    /// prepare rejection branches).
    drafts: Vec<Ranked>,
    /// Committed tokens the round adds when every draft is accepted: the bonus and drafts.
    round_len: usize,
    /// Rejection branches the pre-draft after the last draft prepares.
    branch_width: usize,
    /// Tokens pre-drafted for the next round, assuming every draft is accepted: the
    /// drafter's guess of the target's next token, then drafts after it; all but the last
    /// are fed.
    predraft: Vec<Ranked>,
    /// Pre-drafts for rejection points, once the pre-draft has started them.
    branches: Vec<Branch<C>>,
    /// Whether the pre-draft has set up its branches.
    branched: bool,
    /// The branch whose rejection point the last round met, until the bonus shows whether
    /// its correction was the target's.
    candidate: Option<Branch<C>>,
    /// Caches of branches that went unused, to copy the next branches into.
    spares: Vec<SpareCache<C>>,
    /// Where the last draft started.
    start: DraftStart,
    /// The last tree drafted: what it offered and which nodes ran.
    run_tree: Option<crate::tree_growth::Grown>,
    /// How often the target took this session's first and second choices.
    calibration: crate::tree_growth::Calibration,
}

/// Where a draft started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DraftStart {
    Fresh,
    /// The all-accepted pre-draft.
    Predraft,
    /// A rejection branch of the pre-draft.
    Branch,
}

/// Which prefixes of the draft model's caches a session may open from.
fn prefix_rule<M: CausalLm>(model: &M) -> PrefixRule {
    model.prefix_reuse().rule(model.default_prefill_chunk())
}

fn internal(e: impl std::fmt::Display) -> EngineError {
    EngineError::Internal(e.to_string())
}

impl DraftModelEngine<AnyLm> {
    /// Loads a draft model of any family the registry lets draft as one.
    pub fn load(
        source: &ModelSource,
        spec: &LoadSpec<'_>,
        max_draft_tokens: usize,
    ) -> Result<Self, EngineError> {
        let path = source.path();
        if !source.lm_family().map_err(internal)?.draft_model {
            return Err(EngineError::invalid(
                "drafter",
                format!(
                    "{}: a {} checkpoint does not draft as a draft model",
                    path.display(),
                    source.family().name
                ),
            ));
        }
        let model = source.load_lm(spec).map_err(internal)?.model;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Self::new(model, name, max_draft_tokens))
    }
}

impl<M: CausalLm> DraftModelEngine<M> {
    pub fn new(model: M, name: String, max_draft_tokens: usize) -> Self {
        let draft_vocab = DEFAULT_DRAFT_VOCAB.min(model.vocab_size());
        let rule = prefix_rule(&model);
        Self {
            model,
            name,
            max_draft_tokens,
            draft_vocab,
            prefixes: PrefixCache::new(0, rule),
        }
    }

    /// Keeps up to `max_bytes` of closed sessions' caches for later sessions to open from
    /// (0: none).
    pub fn with_prefix_cache(mut self, max_bytes: usize) -> Self {
        self.prefixes = PrefixCache::new(max_bytes, prefix_rule(&self.model));
        self
    }

    /// A cache holding the longest prefix of `context` a closed session of `scope` left,
    /// and its length; an empty cache when none is reusable.
    fn seeded_cache(
        &self,
        scope: &CacheScope,
        context: &[u32],
    ) -> Result<(M::Cache, usize), EngineError> {
        let cached = self.prefixes.reuse(
            scope,
            context,
            0,
            |cache, len| self.model.truncate(cache, len).is_ok(),
            |state, len| self.model.cache_prefix(state, len, 0).ok().flatten(),
        );
        match cached {
            Some(cached) => Ok(cached),
            None => Ok((self.model.new_cache(0).map_err(internal)?, 0)),
        }
    }

    /// Proposes only ids below `ids` (0 or anything past the vocabulary: every id).
    pub fn with_draft_vocab(mut self, ids: usize) -> Self {
        let vocab = self.model.vocab_size();
        self.draft_vocab = if ids == 0 { vocab } else { ids.min(vocab) };
        self
    }

    /// Drafts are chosen among the ids below this.
    pub fn draft_vocab(&self) -> usize {
        self.draft_vocab
    }

    pub fn model(&self) -> &M {
        &self.model
    }

    /// The greedy token among the draft vocabulary after each sequence's new tokens, in
    /// one forward (on CPU the logits are never materialised, and the head's rows past the
    /// draft vocabulary never read); with `runner_ups`, each one's runner-up as well, from
    /// the same pass. The tokens are the same either way, and the same whichever sequences
    /// share the forward: the model is row-invariant.
    fn next_tokens(
        &self,
        rows: &mut [SeqBlock<'_, M::Cache>],
        runner_ups: bool,
    ) -> Result<Vec<Ranked>, EngineError> {
        let hidden = self
            .model
            .forward(rows, OutputRows::Last)
            .map_err(internal)?;
        if hidden.len() != rows.len() {
            return Err(EngineError::Internal(format!(
                "the draft model returned {} rows for {} sequences",
                hidden.len(),
                rows.len()
            )));
        }
        let hidden = candle_core::Tensor::cat(&hidden, 0)?;
        let ranked = if runner_ups {
            self.model
                .top_two_below(&hidden, self.draft_vocab)
                .map_err(internal)?
        } else {
            self.model
                .argmax_below(&hidden, self.draft_vocab)
                .map_err(internal)?
                .into_iter()
                .map(|best| TopTwo {
                    best: (best, f32::NAN),
                    runner_up: None,
                })
                .collect()
        };
        if ranked.len() != rows.len() {
            return Err(EngineError::Internal(
                "the draft model returned no token".into(),
            ));
        }
        Ok(ranked)
    }
}

impl<M: CausalLm> DraftEngine for DraftModelEngine<M> {
    type Session = DraftModelSession<M::Cache>;

    fn info(&self) -> EngineInfo {
        EngineInfo {
            kind: DrafterKind::DraftModel,
            model: self.name.clone(),
            max_draft_tokens: self.max_draft_tokens,
            vocab_size: self.model.vocab_size(),
        }
    }

    fn device(&self) -> &Device {
        self.model.device()
    }

    fn open(&self, open: OpenSession) -> Result<Self::Session, EngineError> {
        let SessionSource::Context(tokens) = open.source else {
            return Err(EngineError::invalid(
                "open.source",
                "a draft model opens from the context tokens",
            ));
        };
        if tokens.len() != open.committed_len {
            return Err(EngineError::mismatch(
                "open.context_ids",
                format!(
                    "{} tokens for a committed length of {}",
                    tokens.len(),
                    open.committed_len
                ),
            ));
        }
        let vocab = self.model.vocab_size();
        if let Some(i) = tokens.iter().position(|&t| t as usize >= vocab) {
            return Err(EngineError::invalid(
                &format!("open.context_ids[{i}]"),
                format!("token id {} is not below {vocab}", tokens[i]),
            ));
        }
        let (mut cache, cached) = self.seeded_cache(&open.cache_scope, &tokens)?;
        let rest = tokens.get(cached..).unwrap_or_default();
        for piece in rest.chunks(self.model.default_prefill_chunk().max(1)) {
            let mut rows = [SeqBlock::chain(&mut cache, piece)];
            self.model
                .forward(&mut rows, OutputRows::None)
                .map_err(internal)?;
        }
        Ok(DraftModelSession {
            cache,
            prefilled_at_open: rest.len(),
            context: tokens,
            scope: open.cache_scope,
            committed_len: open.committed_len,
            pending: Vec::new(),
            speculated: Vec::new(),
            drafts: Vec::new(),
            round_len: 0,
            branch_width: 0,
            predraft: Vec::new(),
            branches: Vec::new(),
            branched: false,
            candidate: None,
            spares: Vec::new(),
            start: DraftStart::Fresh,
            run_tree: None,
            calibration: Default::default(),
        })
    }

    fn committed_len(&self, session: &Self::Session) -> usize {
        session.committed_len
    }

    fn computed_at_open(&self, session: &Self::Session) -> usize {
        session.prefilled_at_open
    }

    fn apply(&self, session: &mut Self::Session, carry: DraftCarry) -> Result<(), EngineError> {
        let DraftCarry::Tokens(committed) = carry else {
            return Err(EngineError::invalid(
                "draft.carry",
                "a draft model takes the committed tokens",
            ));
        };
        if committed.is_empty() {
            return Ok(());
        }
        if let Some(grown) = session.run_tree.take() {
            session
                .calibration
                .learn(&grown.tree, &grown.offers, &committed);
            // The nodes of the committed path that ran stay, in path order.
            let path = grown.ran.path_of(&committed);
            let start = session.committed_len;
            match path.is_empty() {
                true => self.model.truncate(&mut session.cache, start),
                false => self.model.keep_path(&mut session.cache, start, &path),
            }
            .map_err(internal)?;
            session.pending.extend_from_slice(&committed[path.len()..]);
            session.committed_len += committed.len();
            session.context.extend_from_slice(&committed);
            return Ok(());
        }
        // What the drafter fed last round stays valid up to the first token the target did not commit.
        let cached = self.model.cache_len(&session.cache);
        let speculated_from = cached - session.speculated.len();
        let agree = if session.pending.is_empty() && speculated_from == session.committed_len {
            session
                .speculated
                .iter()
                .zip(&committed)
                .take_while(|(a, b)| a == b)
                .count()
        } else {
            0
        };
        // The round's bonus and drafts as far as the target took them, and nothing else.
        let as_drafted = agree == committed.len();
        let round_len = std::mem::take(&mut session.round_len);
        session.drafts.clear();
        let branches = std::mem::take(&mut session.branches);
        session.branched = false;
        session.committed_len += committed.len();
        session.context.extend_from_slice(&committed);
        let mut candidate = None;
        for branch in branches {
            if as_drafted && branch.accepted + 1 == committed.len() {
                candidate = Some(branch);
            } else {
                session.spare(branch.cache, branch.committed);
            }
        }
        if as_drafted && committed.len() == round_len && !session.predraft.is_empty() {
            // Every draft was accepted: what the pre-draft fed stays, for the next draft.
            session.speculated.drain(..agree);
            return Ok(());
        }
        session.candidate = candidate;
        session.predraft.clear();
        self.model
            .truncate(&mut session.cache, speculated_from + agree)
            .map_err(internal)?;
        session.pending.extend_from_slice(&committed[agree..]);
        session.speculated.clear();
        Ok(())
    }

    fn draft(&self, session: &mut Self::Session, step: DraftStep) -> Result<Vec<u32>, EngineError> {
        let mut jobs = [(session, step)];
        self.draft_many(&mut jobs)
            .pop()
            .unwrap_or_else(|| Err(EngineError::Internal("no draft was made".into())))
    }

    /// A tree grown level by level where the model runs trees (see [`tree_draft`]);
    /// elsewhere the chain, then each likely rejection point's correction (the drafter's
    /// runner-up there) as a leaf beside the draft it would replace (see
    /// [`branches::choose`]).
    fn draft_tree(
        &self,
        session: &mut Self::Session,
        step: DraftStep,
        branching: Branching,
    ) -> Result<DraftTree, EngineError> {
        if self.model.supports_trees() {
            return self.grow_tree(session, step, branching);
        }
        let branch_nodes = branching.nodes;
        let mut jobs = [(session, step)];
        let chain = self
            .draft_ranked(&mut jobs, branch_nodes > 0)
            .pop()
            .unwrap_or_else(|| Err(EngineError::Internal("no draft was made".into())))?;
        let [(session, _)] = jobs;
        Ok(branches::tree(chain, &session.drafts, branch_nodes))
    }

    fn draft_many(
        &self,
        jobs: &mut [(&mut Self::Session, DraftStep)],
    ) -> Vec<Result<Vec<u32>, EngineError>> {
        let runner_ups = jobs.iter().any(|(_, step)| step.branches > 0);
        self.draft_ranked(jobs, runner_ups)
    }

    fn predraft_step(
        &self,
        session: &mut Self::Session,
        count: usize,
    ) -> Result<bool, EngineError> {
        let mut jobs = [(session, count)];
        self.predraft_many(&mut jobs)
            .pop()
            .unwrap_or_else(|| Err(EngineError::Internal("no pre-draft was made".into())))
    }

    fn predraft_many(
        &self,
        jobs: &mut [(&mut Self::Session, usize)],
    ) -> Vec<Result<bool, EngineError>> {
        let mut feeds: Vec<Result<Option<PredraftFeeds>, EngineError>> = jobs
            .iter_mut()
            .map(|(session, count)| self.predraft_feeds(session, *count))
            .collect();
        let runner_ups = jobs.iter().any(|(session, _)| session.branch_width > 0);

        // Every session's pre-drafts (the all-accepted one and its branches) in one forward.
        let outcome = {
            let mut rows = Vec::new();
            for ((session, _), feed) in jobs.iter_mut().zip(&feeds) {
                if let Ok(Some(feed)) = feed {
                    feed.push_rows(session, &mut rows);
                }
            }
            if rows.is_empty() {
                None
            } else {
                Some(self.next_tokens(&mut rows, runner_ups))
            }
        };
        match outcome {
            Some(Ok(ranked)) => {
                let mut ranked = ranked.into_iter();
                for ((session, _), feed) in jobs.iter_mut().zip(&feeds) {
                    if let Ok(Some(feed)) = feed {
                        feed.take(session, &mut ranked);
                    }
                }
            }
            Some(Err(error)) => {
                let message = error.to_string();
                for feed in &mut feeds {
                    if matches!(feed, Ok(Some(_))) {
                        *feed = Err(EngineError::Internal(message.clone()));
                    }
                }
            }
            None => {}
        }
        feeds
            .into_iter()
            .map(|feed| feed.map(|feed| feed.is_some()))
            .collect()
    }

    fn predraft_hit(&self, session: &Self::Session) -> bool {
        session.start != DraftStart::Fresh
    }

    fn predraft_branch_hit(&self, session: &Self::Session) -> bool {
        session.start == DraftStart::Branch
    }

    fn close(&self, session: Self::Session) {
        if !self.prefixes.is_enabled() {
            return;
        }
        // Past the committed tokens fed so far, the cache holds speculated ones.
        let fed = session.committed_len - session.pending.len();
        let DraftModelSession {
            mut cache,
            mut context,
            scope,
            ..
        } = session;
        if fed == 0 || context.len() < fed || self.model.cache_len(&cache) < fed {
            return;
        }
        if self.model.truncate(&mut cache, fed).is_err() {
            return;
        }
        context.truncate(fed);
        let bytes = self.model.cache_bytes(&cache);
        self.prefixes
            .insert(scope, context, fed, cache, bytes, usize::MAX);
    }

    fn prefix_cache(&self) -> Option<PrefixCacheView> {
        self.prefixes.is_enabled().then(|| PrefixCacheView {
            bytes: self.prefixes.held().0,
            capacity_bytes: self.prefixes.max_bytes(),
            totals: self.prefixes.counters().totals(),
        })
    }
}

/// A draft in progress: the drafts so far and what the next forward feeds.
struct DraftJob {
    step: DraftStep,
    drafts: Vec<Ranked>,
    /// Tokens the session's next forward feeds.
    feed: Vec<u32>,
}

/// Ends a draft once every forward ran: what the cache now holds past the committed tokens
/// (the bonus and every draft but the last) and what the next round's carry and pre-draft
/// read.
fn end_draft<C>(session: &mut DraftModelSession<C>, job: DraftJob) -> Vec<u32> {
    let DraftJob { step, drafts, .. } = job;
    session.speculated = std::iter::once(step.bonus)
        .chain(drafts.iter().map(|r| r.best.0))
        .take(drafts.len())
        .collect();
    session.round_len = 1 + drafts.len();
    session.branch_width = step.branches;
    let tokens = drafts.iter().map(|r| r.best.0).collect();
    session.drafts = drafts;
    tokens
}

/// One pre-draft step of a session: the token each of its pre-drafts still short of its
/// length feeds next (the all-accepted one first, then the branches in order).
struct PredraftFeeds {
    main: Option<[u32; 1]>,
    branches: Vec<Option<[u32; 1]>>,
}

impl PredraftFeeds {
    /// Adds the session's rows to a packed forward.
    fn push_rows<'a, C>(
        &'a self,
        session: &'a mut DraftModelSession<C>,
        rows: &mut Vec<SeqBlock<'a, C>>,
    ) {
        let DraftModelSession {
            cache, branches, ..
        } = session;
        if let Some(token) = &self.main {
            rows.push(SeqBlock::chain(cache, token));
        }
        for (branch, feed) in branches.iter_mut().zip(&self.branches) {
            if let Some(token) = feed {
                rows.push(SeqBlock::chain(&mut branch.cache, token));
            }
        }
    }

    /// Takes the session's tokens from the forward's, in the order of its rows.
    fn take<C>(
        &self,
        session: &mut DraftModelSession<C>,
        ranked: &mut impl Iterator<Item = Ranked>,
    ) {
        if let Some([token]) = self.main {
            if let Some(next) = ranked.next() {
                session.speculated.push(token);
                session.predraft.push(next);
            }
        }
        for (branch, feed) in session.branches.iter_mut().zip(&self.branches) {
            if feed.is_some() {
                if let Some(next) = ranked.next() {
                    branch.predraft.push(next);
                }
            }
        }
    }
}

impl<M: CausalLm> DraftModelEngine<M> {
    /// Every job's drafts, the draft steps of all of them in one packed forward per step;
    /// with `runner_ups`, each draft's runner-up is kept beside it.
    fn draft_ranked(
        &self,
        jobs: &mut [(&mut DraftModelSession<M::Cache>, DraftStep)],
        runner_ups: bool,
    ) -> Vec<Result<Vec<u32>, EngineError>> {
        let mut begun: Vec<Result<DraftJob, EngineError>> = jobs
            .iter_mut()
            .map(|(session, step)| self.begin_draft(session, *step))
            .collect();
        // One packed forward per draft step: every session still short of its drafts feeds
        // its next tokens (the first step: its pending committed tokens and the bonus).
        loop {
            let mut fed = Vec::with_capacity(jobs.len());
            let outcome = {
                let mut rows = Vec::with_capacity(jobs.len());
                for (i, ((session, _), job)) in jobs.iter_mut().zip(&begun).enumerate() {
                    if let Ok(job) = job {
                        if job.drafts.len() < job.step.count {
                            rows.push(SeqBlock::chain(&mut session.cache, &job.feed));
                            fed.push(i);
                        }
                    }
                }
                if rows.is_empty() {
                    break;
                }
                self.next_tokens(&mut rows, runner_ups)
            };
            match outcome {
                Ok(ranked) => {
                    for (i, ranked) in fed.into_iter().zip(ranked) {
                        if let Some(Ok(job)) = begun.get_mut(i) {
                            job.feed = vec![ranked.best.0];
                            job.drafts.push(ranked);
                        }
                    }
                }
                Err(error) => {
                    let message = error.to_string();
                    for i in fed {
                        begun[i] = Err(EngineError::Internal(message.clone()));
                    }
                }
            }
        }
        jobs.iter_mut()
            .zip(begun)
            .map(|((session, _), job)| job.map(|job| end_draft(session, job)))
            .collect()
    }

    /// Everything a draft does before its first forward: checks the bonus, starts from the
    /// pre-draft (or a rejection branch) when the target went the way it assumed, and sets
    /// what the first forward feeds.
    fn begin_draft(
        &self,
        session: &mut DraftModelSession<M::Cache>,
        step: DraftStep,
    ) -> Result<DraftJob, EngineError> {
        let vocab = self.model.vocab_size();
        if step.bonus as usize >= vocab {
            return Err(EngineError::invalid(
                "draft.bonus",
                format!("token id {} is not below {vocab}", step.bonus),
            ));
        }
        // Copies kept for branches this round will not make are given back.
        session.spares.truncate(step.branches);
        let mut predraft = std::mem::take(&mut session.predraft);
        session.start = DraftStart::Fresh;
        let candidate = session.candidate.take();
        if session.pending.is_empty() {
            if predraft.first().map(|r| r.best.0) == Some(step.bonus) {
                session.start = DraftStart::Predraft;
            } else if let Some(branch) = candidate {
                if branch.predraft.first().map(|r| r.best.0) == Some(step.bonus) {
                    // The target rejected where the branch assumed, with its correction: the
                    // branch's cache becomes the session's.
                    let old = std::mem::replace(&mut session.cache, branch.cache);
                    let committed = self.model.cache_len(&old);
                    session.spare(old, committed);
                    predraft = branch.predraft;
                    session.start = DraftStart::Branch;
                } else {
                    session.spare(branch.cache, branch.committed);
                }
            }
        } else if let Some(branch) = candidate {
            session.spare(branch.cache, branch.committed);
        }
        // On a hit the pre-drafted tokens after the bonus are this round's first drafts.
        let drafts: Vec<Ranked> = if session.start == DraftStart::Fresh {
            Vec::new()
        } else {
            predraft.into_iter().skip(1).take(step.count).collect()
        };
        if session.pending.is_empty() {
            // The cache holds the committed tokens and whatever a pre-draft fed after them
            // (the bonus and the pre-drafted tokens but the last); keep what drafting the
            // reused drafts would have fed: the bonus and all of them but the last.
            self.model
                .truncate(&mut session.cache, session.committed_len + drafts.len())
                .map_err(internal)?;
        }
        let feed = match drafts.last() {
            Some(last) => vec![last.best.0],
            None => {
                let mut feed = std::mem::take(&mut session.pending);
                feed.push(step.bonus);
                feed
            }
        };
        Ok(DraftJob { step, drafts, feed })
    }

    /// What the session's next pre-draft step feeds (setting up its branches first);
    /// `None` once every pre-draft has `count + 1` tokens.
    fn predraft_feeds(
        &self,
        session: &mut DraftModelSession<M::Cache>,
        count: usize,
    ) -> Result<Option<PredraftFeeds>, EngineError> {
        if !session.branched {
            session.branched = true;
            self.start_branches(session)?;
        }
        // The last pre-drafted token of every pre-draft still short of `count + 1` tokens
        // (for the all-accepted one, the round's last draft to begin with).
        let main = if session.predraft.len() > count {
            None
        } else {
            session
                .predraft
                .last()
                .or(session.drafts.last())
                .map(|r| [r.best.0])
        };
        let branches: Vec<Option<[u32; 1]>> = session
            .branches
            .iter()
            .map(|b| {
                (b.predraft.len() <= count)
                    .then(|| b.predraft.last().map(|r| [r.best.0]))
                    .flatten()
            })
            .collect();
        if main.is_none() && branches.iter().all(Option::is_none) {
            return Ok(None);
        }
        Ok(Some(PredraftFeeds { main, branches }))
    }

    /// Copies the session's cache up to each chosen rejection point into a branch (a spare
    /// cache where there is one, so only the positions it lacks are copied). Without
    /// branches where the model's caches cannot be copied.
    fn start_branches(&self, session: &mut DraftModelSession<M::Cache>) -> Result<(), EngineError> {
        let points = branches::choose(&session.drafts, session.branch_width);
        for point in points {
            let (mut cache, shared) = match session.spares.pop() {
                Some(spare) => (spare.cache, spare.committed),
                None => (self.model.new_cache(0).map_err(internal)?, 0),
            };
            // The committed tokens, the bonus and the drafts the branch assumes accepted.
            let len = session.committed_len + 1 + point.accepted;
            if !self
                .model
                .copy_prefix(&session.cache, &mut cache, shared, len)
                .map_err(internal)?
            {
                return Ok(());
            }
            session.branches.push(Branch {
                accepted: point.accepted,
                cache,
                committed: session.committed_len,
                predraft: vec![TopTwo {
                    best: (point.correction, f32::NAN),
                    runner_up: None,
                }],
            });
        }
        Ok(())
    }
}

impl<C> DraftModelSession<C> {
    /// Drops what a chain draft and its pre-drafts left for the next round (a tree draft
    /// keeps none of it).
    fn forget_speculation(&mut self) {
        self.speculated.clear();
        self.drafts.clear();
        self.round_len = 0;
        self.predraft.clear();
        self.branches.clear();
        self.candidate = None;
        self.branched = false;
        self.start = DraftStart::Fresh;
    }

    /// Keeps a branch's cache for the next branches, as many as the pre-draft makes.
    fn spare(&mut self, cache: C, committed: usize) {
        if self.spares.len() < self.branch_width {
            self.spares.push(SpareCache { cache, committed });
        }
    }
}
