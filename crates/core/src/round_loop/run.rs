//! The per-request round loop: prefill, then draft / verify / emit rounds until a stop.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use tracing::{debug, trace, warn, Instrument};

use super::answer_check::check_verify_answer;
use super::cleanup::Cleanup;
use super::clock::{Clock, SystemClock};
use super::control::RequestControl;
use super::error::RoundLoopError;
use super::events::{Event, EventSink, Finish, TokenDelta};
use super::observe;
use super::request::GenerationRequest;
use crate::block_size::{BlockPlanner, DraftMeasurement, OpenCost, RoundOutcome, TreeChoice};
use crate::constraint::TokenConstraint;
use crate::drafter::{DraftRequest, Drafter, NoDrafter, OpenRequest, Opened};
use crate::fallback::{DrafterFallback, FallbackCause};
use crate::finish::FinishReason;
use crate::sampling::{TokenLogprob, TokenMask};
use crate::stats::SpecStats;
use crate::stop::{Detokenizer, StopChecker};
use crate::tree::DraftTree;
use crate::verifier::{PrefillRequest, Verified, Verifier, VerifyRequest};

/// Prompt tokens given to the detokenizer as context for the first text delta.
const DETOKENIZE_CONTEXT: usize = 5;

/// Runs requests against one verifier, an optional drafter and a detokenizer.
pub struct RoundLoop<'a, V, D, T: ?Sized> {
    verifier: &'a V,
    drafter: Option<&'a D>,
    detokenizer: &'a T,
    clock: &'a dyn Clock,
    /// The target's vocabulary size, when known: drafts at or past it are a drafter fault.
    vocab_size: Option<usize>,
}

impl<'a, V, T> RoundLoop<'a, V, NoDrafter<V::Carry>, T>
where
    V: Verifier,
    T: Detokenizer + ?Sized,
{
    /// A loop without drafter: every round is a plain decoding step through the verifier.
    pub fn plain(verifier: &'a V, detokenizer: &'a T) -> Self {
        Self {
            verifier,
            drafter: None,
            detokenizer,
            clock: &SystemClock,
            vocab_size: None,
        }
    }
}

impl<'a, V, D, T> RoundLoop<'a, V, D, T>
where
    V: Verifier,
    D: Drafter<Carry = V::Carry>,
    T: Detokenizer + ?Sized,
{
    /// A loop that drafts with `drafter` when a request's block size allows it.
    pub fn new(verifier: &'a V, drafter: Option<&'a D>, detokenizer: &'a T) -> Self {
        Self {
            verifier,
            drafter,
            detokenizer,
            clock: &SystemClock,
            vocab_size: None,
        }
    }

    /// This loop checking every draft against a vocabulary of `vocab_size` tokens: a draft
    /// outside it ends speculation for the request (counted as an invalid draft) instead of
    /// reaching the verifier, which would refuse the round.
    pub fn with_vocab_size(self, vocab_size: usize) -> Self {
        Self {
            vocab_size: Some(vocab_size),
            ..self
        }
    }

    /// This loop measuring draft and verify calls with `clock` (for the cost-aware block
    /// size) instead of the system clock.
    pub fn with_clock(self, clock: &'a dyn Clock) -> Self {
        Self { clock, ..self }
    }

    /// Generates one request, sending [`Event`]s to `sink`, and returns how it finished.
    ///
    /// Emitted tokens are always the target's choices, so the output is the same with any
    /// drafter, block size or drafter failure. On success the last event is
    /// [`Event::Finished`]; on error no such event is sent. Either way the verifier sequence
    /// is released and the drafter session closed before this returns. If the returned
    /// future is dropped before completion, a guard frees both through `release_detached` /
    /// `close_detached`. To stop a request gracefully, use [`RequestControl::cancel`].
    pub async fn run<S: EventSink>(
        &self,
        request: GenerationRequest,
        sink: &mut S,
        control: &RequestControl,
    ) -> Result<Finish, RoundLoopError<V::Error>> {
        self.run_constrained(request, None, sink, control).await
    }

    /// [`RoundLoop::run`] with every emitted token held to `constraint`: each position the
    /// target samples is masked to what the constraint allows (in plain and speculative
    /// rounds alike, so the output stays the same), drafts it refuses are cut, and tokens it
    /// forces are verified as drafts (up to the request's `forced_drafts` per round).
    pub async fn run_constrained<S: EventSink>(
        &self,
        request: GenerationRequest,
        constraint: Option<Box<dyn TokenConstraint>>,
        sink: &mut S,
        control: &RequestControl,
    ) -> Result<Finish, RoundLoopError<V::Error>> {
        request.validate()?;
        let mut cleanup = Cleanup::new(self.verifier, request.seq);
        let span = observe::generate_span(request.prompt_ids.len(), request.stop.max_tokens);
        let mut generation = Generation::new(self, &request, sink, control, &mut cleanup);
        generation.constraint = constraint;
        let result = generation.run().instrument(span).await;
        cleanup.finish().await;
        result
    }
}

/// Tokens one step managed to emit.
struct Emitted {
    count: usize,
    finish: Option<FinishReason>,
}

/// State of one request between rounds.
struct Generation<'a, 'r, V: Verifier, D: Drafter, T: ?Sized, S> {
    verifier: &'a V,
    /// The drafter while its session is usable.
    drafter: Option<&'a D>,
    request: &'r GenerationRequest,
    sink: &'r mut S,
    sink_closed: bool,
    control: &'r RequestControl,
    cleanup: &'r mut Cleanup<'a, V, D>,
    stop: StopChecker<'a, T>,
    planner: BlockPlanner,
    clock: &'a dyn Clock,
    vocab_size: Option<usize>,
    stats: SpecStats,
    /// Last emitted token, not yet in the target cache.
    bonus: u32,
    emitted: usize,
    /// Tokens in the target cache, prompt included.
    committed_len: usize,
    round: u32,
    /// Carries and committed tokens not yet shipped to the drafter (rounds without drafts
    /// still produce them).
    pending_carries: Vec<V::Carry>,
    pending_committed: Vec<u32>,
    /// What the emitted tokens must keep to, when the request has a format.
    constraint: Option<Box<dyn TokenConstraint>>,
    /// Whether this request's rounds branch, from what trees and chains cost in it.
    tree_choice: TreeChoice,
}

/// A drafter session's open in flight.
struct Opening<'a, E> {
    future: Pin<Box<dyn Future<Output = Result<Opened, E>> + Send + 'a>>,
    started: std::time::Instant,
}

type Step<E> = Result<Option<FinishReason>, RoundLoopError<E>>;

/// Drafts the constraint let through, and every verify row's mask.
type Constrained<E> = Result<(Vec<u32>, Vec<TokenMask>), RoundLoopError<E>>;

impl<'a, 'r, V, D, T, S> Generation<'a, 'r, V, D, T, S>
where
    V: Verifier,
    D: Drafter<Carry = V::Carry>,
    T: Detokenizer + ?Sized,
    S: EventSink,
{
    fn new(
        parts: &RoundLoop<'a, V, D, T>,
        request: &'r GenerationRequest,
        sink: &'r mut S,
        control: &'r RequestControl,
        cleanup: &'r mut Cleanup<'a, V, D>,
    ) -> Self {
        let mut planner = BlockPlanner::new(request.block_size, control);
        let drafter = parts.drafter.filter(|_| planner.may_draft());
        if drafter.is_none() {
            planner.stop_drafting();
        }
        let prompt = &request.prompt_ids;
        let context = &prompt[prompt.len().saturating_sub(DETOKENIZE_CONTEXT)..];
        Self {
            verifier: parts.verifier,
            drafter,
            request,
            sink,
            sink_closed: false,
            control,
            cleanup,
            stop: StopChecker::new(parts.detokenizer, request.stop.clone(), context),
            planner,
            clock: parts.clock,
            vocab_size: parts.vocab_size,
            stats: SpecStats::default(),
            bonus: 0,
            emitted: 0,
            committed_len: prompt.len(),
            round: 0,
            pending_carries: Vec::new(),
            pending_committed: Vec::new(),
            constraint: None,
            tree_choice: TreeChoice::default(),
        }
    }

    async fn run(mut self) -> Result<Finish, RoundLoopError<V::Error>> {
        let mut timer = observe::RequestTimer::start();
        if self.planner.decline_every_open() {
            self.decline_speculation();
        }
        let mask = match self.constraint.as_deref_mut() {
            Some(constraint) => Some(constraint.next_mask()?),
            None => None,
        };
        let prefilled = self
            .verifier
            .prefill(PrefillRequest {
                seq: self.request.seq,
                prompt_ids: self.request.prompt_ids.clone(),
                sampling: self.request.sampling,
                want_carry: self.drafter.is_some(),
                cache_scope: self.request.cache_scope.clone(),
                rules: self.request.rules.clone(),
                top_logprobs: self.request.top_logprobs,
                mask,
                emitted_in_prompt: 0,
            })
            .await
            .map_err(RoundLoopError::Verifier)?;
        self.stats.cached_prompt_tokens = prefilled.cached_tokens as u64;
        observe::prefilled(prefilled.cached_tokens);
        // Judged once the verifier's prefix cache has answered: a drafter with a cache of
        // its own opens on what the verifier held for far less than the whole prompt.
        if self.planner.decline_unpaying(
            self.request.prompt_ids.len(),
            prefilled.cached_tokens,
            self.request.stop.max_tokens,
        ) {
            self.decline_speculation();
        }
        self.bonus = prefilled.first_token;
        // The first token goes out before the drafter session opens (a draft model prefills
        // the whole prompt to open), so speculation never delays it.
        let logprobs: Vec<TokenLogprob> = prefilled.first_logprob.into_iter().collect();
        let mut finish = self.emit(&[prefilled.first_token], logprobs).await?.finish;
        timer.first_token();
        let mut opening = match finish {
            None => self.start_open(prefilled.carry),
            Some(_) => None,
        };
        let reason = loop {
            match finish {
                Some(reason) => break reason,
                None => finish = self.next_round(&mut opening).await?,
            }
        };
        let finish = self.finish(reason).await;
        timer.finished(&finish);
        Ok(finish)
    }

    /// Runs plain, with no drafter session at all: the planner said speculation would not
    /// pay for opening the session.
    fn decline_speculation(&mut self) {
        debug!(seq = %self.request.seq, "speculation declined: it would not pay");
        self.drafter = None;
    }

    /// Starts opening the drafter session. Rounds run plain beside the open and speculation
    /// starts with the first round after it completes; until then the rounds' carries are
    /// kept for the session's first draft call.
    fn start_open(&mut self, carry: Option<V::Carry>) -> Option<Opening<'a, D::Error>> {
        let drafter = self.drafter?;
        let Some(carry) = carry else {
            self.fall_back(
                FallbackCause::MissingCarry,
                "prefill returned no carry".into(),
            );
            return None;
        };
        self.cleanup.session_opening(drafter, self.request.session);
        let future = drafter.open(OpenRequest {
            session: self.request.session,
            prompt_ids: self.request.prompt_ids.clone(),
            sampling: self.request.sampling,
            carry,
            cache_scope: self.request.cache_scope.clone(),
        });
        Some(Opening {
            future: Box::pin(future),
            started: self.clock.now(),
        })
    }

    /// The next round, with the drafter session's open (if pending) driven beside it.
    async fn next_round(&mut self, opening: &mut Option<Opening<'a, D::Error>>) -> Step<V::Error> {
        // An open that is done (an in-process drafter opens synchronously when polled) makes
        // this round the first speculative one.
        if let Some(open) = opening.as_mut() {
            let polled = std::future::poll_fn(|cx| Poll::Ready(open.future.as_mut().poll(cx)));
            if let Poll::Ready(outcome) = polled.await {
                let done = self.clock.now();
                self.opened(outcome, open.started, done);
                *opening = None;
            }
        }
        let Some(open) = opening.as_mut() else {
            return observe::round(self.round, self.round(false)).await;
        };
        let mut opened = None;
        // The open's time ends when it completes, not when the round beside it does: a
        // short prompt's open would otherwise take a whole round's time and price every
        // prompt token of a later, longer prompt as dear.
        let clock = self.clock;
        let step = {
            let mut round = std::pin::pin!(observe::round(self.round, self.round(true)));
            std::future::poll_fn(|cx| {
                // Driven beside the round, for drafters whose open progresses only when polled.
                if opened.is_none() {
                    if let Poll::Ready(outcome) = open.future.as_mut().poll(cx) {
                        opened = Some((outcome, clock.now()));
                    }
                }
                round.as_mut().poll(cx)
            })
            .await
        };
        let done = opened.is_some();
        if let Some((outcome, done)) = opened {
            self.opened(outcome, open.started, done);
        }
        // Speculation may also have ended during the open (its session is then already
        // being closed).
        if done || self.drafter.is_none() {
            *opening = None;
        }
        step
    }

    /// Books the outcome of the drafter session's open.
    fn opened(
        &mut self,
        outcome: Result<Opened, D::Error>,
        started: std::time::Instant,
        done: std::time::Instant,
    ) {
        match outcome {
            Ok(opened) => {
                let prompt = self.request.prompt_ids.len();
                let open = OpenCost {
                    prompt,
                    verifier_cached: self.stats.cached_prompt_tokens as usize,
                    computed: opened.computed.unwrap_or(prompt),
                    time: done.saturating_duration_since(started),
                };
                debug!(
                    seq = %self.request.seq,
                    prompt,
                    cached = open.verifier_cached,
                    computed = open.computed,
                    ms = open.time.as_secs_f64() * 1e3,
                    "drafter session opened"
                );
                self.planner.record_open(&open);
            }
            Err(error) => self.fall_back(FallbackCause::Open, error.to_string()),
        }
    }

    /// One draft / verify / emit round; returns the finish reason once generation ends. A
    /// round while the drafter session is `opening` is plain.
    async fn round(&mut self, opening: bool) -> Step<V::Error> {
        if self.control.is_cancelled() {
            return Ok(Some(FinishReason::Cancelled));
        }
        let budget = self.request.stop.max_tokens.saturating_sub(self.emitted);
        if budget == 0 {
            return Ok(Some(FinishReason::Length));
        }
        let block_size = self.plan_block(budget + 1, opening);
        observe::block_size(block_size);
        let mut draft_measurement = None;
        let mut drafting_alongside = 1;
        let forced = self.forced_drafts(budget);
        let drafts = match self.drafter {
            _ if !forced.is_empty() => DraftTree::chain(forced.clone()),
            Some(drafter) if block_size > 1 => {
                let catch_up = self.pending_carries.len() > 1;
                let in_progress = self.planner.draft_started();
                drafting_alongside = in_progress.concurrent();
                let start = self.clock.now();
                let drafts = self.draft(drafter, block_size - 1).await;
                draft_measurement = Some(DraftMeasurement {
                    steps: block_size - 1,
                    time: self.clock.now().saturating_duration_since(start),
                    catch_up,
                });
                drafts
            }
            _ => DraftTree::default(),
        };
        let (drafts, masks) = match drafts.is_chain() {
            true => {
                let (chain, masks) = self.constrain(drafts.tokens)?;
                (DraftTree::chain(chain), masks)
            }
            // Trees are drafted only without a constraint.
            false => (drafts, Vec::new()),
        };
        let verify_start = self.clock.now();
        let verified = self.verify(&drafts, budget, masks).await?;
        let verify_time = self.clock.now().saturating_duration_since(verify_start);
        if let Some(draft) = draft_measurement.filter(|_| self.branching_allowed()) {
            let tokens = verified.new_tokens.len();
            let time = draft.time + verify_time;
            self.tree_choice.record(!drafts.is_chain(), time, tokens);
            self.tree_choice.record_verify(
                !drafts.is_chain(),
                drafts.tokens.len() + 1,
                verify_time,
            );
        }
        if forced.is_empty() {
            self.planner.observe(&RoundOutcome {
                draft: draft_measurement,
                drafting_alongside,
                // A tree's branches are verify rows the forward's cost holds; its depth is
                // the chain the block size planned.
                drafted: drafts.depth(),
                branches: drafts.tokens.len() - drafts.depth(),
                verify_time,
                forward: verified.forward,
                accepted: verified.accepted,
                beside_open: opening,
            });
        } else {
            // Forced drafts tell nothing of the drafter; only the counts keep them.
            self.stats.forced_drafted += drafts.tokens.len() as u64;
            self.stats.forced_accepted += verified.accepted as u64;
        }
        let committed_before = self.committed_len;
        let accepted = verified.accepted;
        self.commit(&drafts, &verified.new_tokens, accepted, verified.carry);

        let emitted = self.emit(&verified.new_tokens, verified.logprobs).await?;
        if let Some(reason) = emitted.finish {
            if emitted.count < accepted + 1 {
                // The cache holds the whole accepted block; keep it to the prompt and every
                // emitted token but the last, as after any round.
                self.committed_len = committed_before + emitted.count;
                self.truncate().await;
            }
            return Ok(Some(reason));
        }
        if let Some(&bonus) = verified.new_tokens.last() {
            self.bonus = bonus;
        }
        Ok(None)
    }

    /// What the constraint forces next, as free drafts (none without a constraint).
    fn forced_drafts(&mut self, budget: usize) -> Vec<u32> {
        let max = self.request.forced_drafts.min(budget);
        match self.constraint.as_deref_mut() {
            Some(constraint) if max > 0 => constraint.forced(max),
            _ => Vec::new(),
        }
    }

    /// The drafts the constraint lets through and every verify row's mask (no masks
    /// without a constraint).
    fn constrain(&mut self, mut drafts: Vec<u32>) -> Constrained<V::Error> {
        let Some(constraint) = self.constraint.as_deref_mut() else {
            return Ok((drafts, Vec::new()));
        };
        let block = constraint.block_masks(&drafts)?;
        if block.kept < drafts.len() {
            debug!(
                seq = %self.request.seq,
                round = self.round,
                drafted = drafts.len(),
                kept = block.kept,
                "the constraint cut the drafts"
            );
            drafts.truncate(block.kept);
        }
        Ok((drafts, block.masks))
    }

    /// The planner's block size for the next round, booked in the stats.
    fn plan_block(&mut self, remaining: usize, opening: bool) -> usize {
        let plan = self
            .planner
            .plan(remaining, opening, self.drafter.is_some());
        if plan.speculation_off {
            self.stats.speculation_off_rounds += 1;
        }
        if let Some(on) = plan.switched {
            self.stats.speculation_switches += 1;
            observe::speculation_switch(on);
            debug!(
                seq = %self.request.seq,
                round = self.round,
                off = !on,
                "speculation switched"
            );
        }
        plan.block_size
    }

    /// Verifies `[bonus, drafts..]` and checks the answer.
    async fn verify(
        &mut self,
        drafts: &DraftTree,
        budget: usize,
        masks: Vec<TokenMask>,
    ) -> Result<Verified<V::Carry>, RoundLoopError<V::Error>> {
        let round = self.round;
        let mut tokens = Vec::with_capacity(drafts.tokens.len() + 1);
        tokens.push(self.bonus);
        tokens.extend_from_slice(&drafts.tokens);
        let verified = self
            .verifier
            .verify(VerifyRequest {
                seq: self.request.seq,
                round,
                tokens,
                budget,
                output_index_base: self.emitted as u64,
                want_carry: self.drafter.is_some(),
                masks,
                parents: drafts.parents.clone(),
            })
            .await
            .map_err(RoundLoopError::Verifier)?;
        check_verify_answer(drafts, budget, verified.accepted, &verified.new_tokens)
            .map_err(|reason| RoundLoopError::InvalidVerifyAnswer { round, reason })?;
        if self.request.top_logprobs.is_some()
            && verified.logprobs.len() != verified.new_tokens.len()
        {
            return Err(RoundLoopError::InvalidVerifyAnswer {
                round,
                reason: format!(
                    "{} log probabilities for {} tokens",
                    verified.logprobs.len(),
                    verified.new_tokens.len()
                ),
            });
        }
        debug!(
            seq = %self.request.seq,
            round,
            drafted = drafts.tokens.len(),
            tree = !drafts.is_chain(),
            accepted = verified.accepted,
            "round verified"
        );
        Ok(verified)
    }

    /// Books a verified round: stats, history, cache length and what the drafter must learn.
    fn commit(
        &mut self,
        drafts: &DraftTree,
        new_tokens: &[u32],
        accepted: usize,
        carry: Option<V::Carry>,
    ) {
        let drafted = drafts.tokens.len();
        self.stats.record_round(drafts.depth(), accepted);
        if !drafts.is_chain() {
            let branches = (drafted - drafts.depth()) as u64;
            self.stats.tree_rounds += 1;
            self.stats.tree_branch_drafts += branches;
            self.stats.drafted += branches;
        }
        let drafter_kind = self.drafter.map_or("none", |drafter| drafter.kind());
        // Positions are depths, as in the stats: a tree's branches share them.
        observe::verified(drafter_kind, &drafts.depths(), accepted);
        self.committed_len += accepted + 1;
        if self.drafter.is_some() {
            match carry {
                Some(carry) => {
                    self.pending_carries.push(carry);
                    self.pending_committed.push(self.bonus);
                    // A tree's accepted path begins the new tokens (checked with the answer:
                    // its depth is within the budget); a chain's is its first drafts.
                    let path = match drafts.is_chain() {
                        true => &drafts.tokens[..accepted.min(drafts.tokens.len())],
                        false => &new_tokens[..accepted.min(new_tokens.len())],
                    };
                    self.pending_committed.extend_from_slice(path);
                }
                None => self.fall_back(
                    FallbackCause::MissingCarry,
                    "verify returned no carry".to_owned(),
                ),
            }
        }
        self.round = self.round.saturating_add(1);
    }

    /// Asks the drafter for `count` drafts (a tree of that depth when the round may
    /// branch); on failure falls back and returns none.
    async fn draft(&mut self, drafter: &'a D, count: usize) -> DraftTree {
        let tree_nodes = if self.may_branch() {
            self.request.block_size.tree_nodes
        } else {
            0
        };
        let request = DraftRequest {
            session: self.request.session,
            round: self.round,
            bonus: self.bonus,
            carries: std::mem::take(&mut self.pending_carries),
            committed_tokens: std::mem::take(&mut self.pending_committed),
            committed_len: self.committed_len,
            output_index_base: self.emitted as u64,
            count,
            tree_nodes,
            least_branch_chance: self.tree_choice.least_branch_chance(tree_nodes),
        };
        if let Some(chance) = request.least_branch_chance {
            trace!(seq = %self.request.seq, chance, "branch rows priced");
        }
        let drafted = if tree_nodes > 0 {
            drafter.draft_tree(request).await
        } else {
            drafter.draft(request).await.map(DraftTree::chain)
        };
        let drafts = match drafted {
            Ok(drafts) => drafts,
            Err(error) => {
                self.fall_back(FallbackCause::Draft, error.to_string());
                return DraftTree::default();
            }
        };
        let wrong = if !drafts.fits(count, tree_nodes) {
            Some(format!(
                "asked for {count} drafts and {tree_nodes} branch drafts, got {} in {} levels",
                drafts.tokens.len(),
                drafts.depth()
            ))
        } else {
            drafts
                .check()
                .err()
                .or_else(|| self.out_of_vocabulary(&drafts.tokens))
        };
        match wrong {
            None => drafts,
            Some(message) => {
                self.fall_back(FallbackCause::InvalidDraft, message);
                DraftTree::default()
            }
        }
    }

    /// Whether the request's rounds may branch at all (see [`Self::may_branch`]).
    fn branching_allowed(&self) -> bool {
        self.request.block_size.tree_nodes > 0
            && self.constraint.is_none()
            && self.request.rules.is_neutral()
            && self.request.top_logprobs.is_none()
    }

    /// Whether this round verifies a token tree: the request may branch (nothing it asks
    /// for reads a row's context: penalties, masks, log probabilities, so each tree row is
    /// shaped as plainly as a chain's) and trees cost less per token than chains in it.
    fn may_branch(&mut self) -> bool {
        self.branching_allowed() && self.tree_choice.next_is_tree()
    }

    /// What is wrong with `drafts` if one is not a token of the target's vocabulary.
    fn out_of_vocabulary(&self, drafts: &[u32]) -> Option<String> {
        let vocab = self.vocab_size?;
        let i = drafts.iter().position(|&token| token as usize >= vocab)?;
        Some(format!(
            "draft {i} is token {}, not below the vocabulary size {vocab}",
            drafts[i]
        ))
    }

    /// Continues without speculation; the output does not change.
    fn fall_back(&mut self, cause: FallbackCause, message: String) {
        warn!(
            seq = %self.request.seq,
            round = self.round,
            cause = cause.as_str(),
            %message,
            "drafter failed; continuing without speculation"
        );
        observe::fallback(cause);
        self.stats.fallback = Some(DrafterFallback {
            round: self.round,
            cause,
            message,
        });
        self.planner.stop_drafting();
        self.drafter = None;
        self.pending_carries.clear();
        self.pending_committed.clear();
        self.cleanup.detach_session();
    }

    async fn truncate(&mut self) {
        let truncated = self
            .verifier
            .truncate(self.request.seq, self.committed_len)
            .await;
        if let Err(error) = truncated {
            // The sequence is released right after; a longer cache costs nothing.
            warn!(seq = %self.request.seq, %error, "truncating the verifier sequence failed");
        }
    }

    /// Runs `tokens` through the stop checker (and the constraint) and sends what was
    /// emitted as one event, with the tokens' log probabilities when there are any.
    async fn emit(
        &mut self,
        tokens: &[u32],
        mut logprobs: Vec<TokenLogprob>,
    ) -> Result<Emitted, RoundLoopError<V::Error>> {
        let first_index = self.emitted as u64;
        let mut text = String::new();
        let mut count = 0;
        let mut finish = None;
        for &token in tokens {
            let outcome = self.stop.push(token)?;
            text.push_str(&outcome.text);
            count += 1;
            if outcome.finish.is_some() {
                finish = outcome.finish;
            }
            if let Some(constraint) = self.constraint.as_deref_mut() {
                constraint.commit(&[token])?;
                // Nothing may follow a complete format: generation ends at the token that
                // completed it, in whichever round that token came (with `ignore_eos`, the
                // end-of-sequence token stops nothing else).
                if finish.is_none() && constraint.is_complete() {
                    finish = Some(FinishReason::Eos);
                }
            }
            if finish.is_some() {
                break;
            }
        }
        self.emitted += count;
        observe::emitted(count);
        logprobs.truncate(count);
        let delta = TokenDelta {
            first_index,
            tokens: tokens[..count].to_vec(),
            text,
            logprobs,
        };
        if self.sink.send(Event::Tokens(delta)).await.is_err() {
            self.sink_closed = true;
            finish = finish.or(Some(FinishReason::Cancelled));
        }
        Ok(Emitted { count, finish })
    }

    async fn finish(self, reason: FinishReason) -> Finish {
        let finish = Finish {
            reason,
            tokens_emitted: self.emitted,
            stats: self.stats,
        };
        if !self.sink_closed {
            // A receiver gone at the very end changes nothing.
            let _ = self.sink.send(Event::Finished(finish.clone())).await;
        }
        finish
    }
}
