//! Running one request: the round loop over the verifier and the request's drafter.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use specd_core::{
    BlockSizeConfig, CacheScope, Drafter, EventSink, Finish, GenerationRequest, HybridDrafter,
    NgramDrafter, RequestControl, RoundLoop, RoundLoopError, SeqId, SessionId, StopConditions,
};
use specd_wire::drafter::DrafterKind;
use tonic::Status;

use crate::admission::Admission;
use crate::affinity::prefix_chain;
use crate::carry::WireCarry;
use crate::config::{RouterConfig, TargetLimits};
use crate::drafters::{DrafterPool, Drafters, Lease};
use crate::error::RemoteError;
use crate::in_process::{loop_status, run_in_process, InProcessEngine};
use crate::output_format::Grammars;
use crate::overlap::{Overlap, OverlapMode};
use crate::predraft::{PredraftCounts, Predrafting};
use crate::remote_drafter::RemoteSession;
use crate::remote_verifier::{RemoteSequence, SequenceOptions};
use crate::validate::{BlockChoice, Plan};
use crate::verifiers::VerifierPool;
use specd_text::TargetText;

/// Where requests run.
pub(crate) enum Backend {
    /// Verifier replicas (and drafters, by `drafters`) over gRPC.
    Remote(Arc<VerifierPool>),
    /// A verifier and drafter in this process.
    InProcess(Arc<dyn InProcessEngine>),
}

/// Where a request's drafts come from.
enum Drafting<'a> {
    /// None: plain decoding.
    Plain,
    /// Prompt lookup in the router.
    Lookup(&'a Arc<NgramDrafter<WireCarry>>),
    /// A session on the pool's drafter the lease holds (behind the lookup when hybrid).
    Service(&'a Arc<DrafterPool>, Lease),
}

/// Everything requests share.
pub struct RouterState {
    pub(crate) backend: Backend,
    pub(crate) limits: TargetLimits,
    pub(crate) config: RouterConfig,
    pub(crate) drafters: Drafters,
    pub(crate) text: Arc<TargetText>,
    pub(crate) admission: Arc<Admission>,
    /// Whether drafters pre-draft, per drafter, from what the rounds measured.
    pub(crate) overlap: Arc<Overlap>,
    /// The target's vocabulary for output constraints.
    pub(crate) grammars: Arc<Grammars>,
    next_id: AtomicU64,
}

/// What a request brings to its run besides the plan.
pub(crate) struct RequestScope {
    /// The client's deadline: every call carries the time left, and the request ends with
    /// DEADLINE_EXCEEDED once it passes.
    pub deadline: Option<Instant>,
    /// Drafter sessions the request re-opened elsewhere after a drafter failed.
    pub resyncs: Arc<AtomicU32>,
    /// Moves of the request's sequence to another verifier replica.
    pub migrations: Arc<AtomicU32>,
    /// Pre-draft hits and misses of the request's drafter session.
    pub predraft: Arc<PredraftCounts>,
    /// Which cached prompt prefixes the request may reuse.
    pub cache_scope: CacheScope,
}

impl RouterState {
    pub(crate) fn new(
        backend: Backend,
        limits: TargetLimits,
        config: RouterConfig,
        drafters: Drafters,
        text: Arc<TargetText>,
    ) -> Self {
        let max_block_size = config.block_ceiling(&limits);
        let drafter_parallelism = match &backend {
            Backend::InProcess(engine) => engine.drafter_parallelism(),
            Backend::Remote(_) => drafters.pool().map_or(0, |pool| pool.size()),
        };
        let admission = Arc::new(Admission::new(
            config.max_concurrent_requests,
            config.max_batch_tokens,
            max_block_size,
            drafter_parallelism,
        ));
        let grammars = Arc::new(Grammars::new(text.clone(), limits.vocab_size));
        // The vocabulary trie takes a pass over every token: built now, beside startup,
        // rather than by the first request that asks for a format.
        let warm = grammars.clone();
        let _ = std::thread::Builder::new()
            .name("grammar-vocabulary".into())
            .spawn(move || warm.prepare());
        Self {
            backend,
            grammars,
            limits,
            overlap: Arc::new(Overlap::new(config.overlap)),
            config,
            drafters,
            text,
            admission,
            next_id: AtomicU64::new(1),
        }
    }

    /// Generates `plan`, sending events to `sink`. The verifier sequence and any drafter
    /// session are freed however this ends, including when the future is dropped or the
    /// deadline passes.
    pub(crate) async fn run<S: EventSink>(
        &self,
        plan: Plan,
        sink: &mut S,
        control: &RequestControl,
        scope: &RequestScope,
    ) -> Result<Finish, Status> {
        let run = self.run_loop(plan, sink, control, scope);
        let run = async {
            match self.config.requests.max_duration {
                Some(limit) => tokio::time::timeout(limit, run).await.unwrap_or_else(|_| {
                    Err(Status::deadline_exceeded(format!(
                        "the request ran longer than this server's limit of {} s \
                         (--max-request-secs)",
                        limit.as_secs()
                    )))
                }),
                None => run.await,
            }
        };
        match scope.deadline {
            Some(deadline) => tokio::time::timeout_at(deadline.into(), run)
                .await
                .unwrap_or_else(|_| {
                    Err(Status::deadline_exceeded(
                        "the request's deadline passed before it finished",
                    ))
                }),
            None => run.await,
        }
    }

    async fn run_loop<S: EventSink>(
        &self,
        mut plan: Plan,
        sink: &mut S,
        control: &RequestControl,
        scope: &RequestScope,
    ) -> Result<Finish, Status> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut block = self.block_config(plan.block);
        let mut options = SequenceOptions {
            max_new_tokens: u32::try_from(plan.max_tokens).unwrap_or(u32::MAX),
            with_mtp_state: false,
            max_chunk_bytes: self.config.limits.snapshot_chunk_bytes() as u64,
            deadline: scope.deadline,
            max_snapshot_bytes: self.config.max_snapshot_bytes,
        };
        // Forced tokens are verified as drafts unless the request turned speculation (or
        // fast-forward) off.
        let forced_drafts = match plan.block {
            BlockChoice::Disabled => 0,
            _ if !plan.fast_forward => 0,
            _ => self.config.block_ceiling(&self.limits).saturating_sub(1),
        };
        let constraint = plan.constraint.take();
        let request = |block_size| GenerationRequest {
            seq: SeqId(id),
            session: SessionId(id),
            prompt_ids: plan.prompt_ids.clone(),
            sampling: plan.sampling,
            stop: StopConditions {
                max_tokens: plan.max_tokens,
                eos_token_ids: plan.eos_token_ids.clone(),
                ignore_eos: plan.ignore_eos,
                stop_token_ids: Vec::new(),
                stop_strings: plan.stop.clone(),
            },
            block_size,
            cache_scope: scope.cache_scope.clone(),
            rules: plan.rules.clone(),
            top_logprobs: plan.top_logprobs,
            forced_drafts,
        };
        let verifiers = match &self.backend {
            Backend::Remote(verifiers) => verifiers,
            Backend::InProcess(engine) => {
                block = match engine.speculates() {
                    true => self.with_trees(block),
                    false => BlockSizeConfig::PLAIN,
                };
                return run_in_process(
                    engine,
                    request(block),
                    constraint,
                    self.text.clone(),
                    sink,
                    control,
                )
                .await;
            }
        };
        let choice = match (&self.drafters, block.is_speculative()) {
            (Drafters::Ngram(ngram), true) => Drafting::Lookup(ngram),
            (Drafters::Remote(pool) | Drafters::Hybrid { pool, .. }, true) => {
                match (self.pick_drafter(pool, &plan, scope).await, &self.drafters) {
                    (Some(lease), _) => Drafting::Service(pool, lease),
                    // With no drafter to be had, a hybrid request still has the lookup.
                    (None, Drafters::Hybrid { lookup, .. }) => Drafting::Lookup(lookup),
                    (None, _) => Drafting::Plain,
                }
            }
            _ => Drafting::Plain,
        };
        let result = match choice {
            Drafting::Plain => {
                let verifier = self.sequence(verifiers, options, scope);
                RoundLoop::plain(&verifier, &*self.text)
                    .run_constrained(request(BlockSizeConfig::PLAIN), constraint, sink, control)
                    .await
            }
            Drafting::Lookup(lookup) => {
                let verifier = self.sequence(verifiers, options, scope);
                self.round_loop(&verifier, Some(&**lookup))
                    .run_constrained(request(self.with_trees(block)), constraint, sink, control)
                    .await
            }
            Drafting::Service(pool, lease) => {
                let info = lease.info();
                let depth = info.max_draft_tokens + 1;
                block.requested = block.requested.min(depth);
                block.configured = block.configured.min(depth);
                block = self.with_trees(block);
                block.tree_nodes = block.tree_nodes.min(info.max_draft_tokens);
                options.with_mtp_state = info.kind == DrafterKind::Mtp;
                let verifier = self.sequence(verifiers, options, scope);
                let session = RemoteSession::new(
                    pool.clone(),
                    lease,
                    &verifier,
                    scope.deadline,
                    scope.resyncs.clone(),
                    (self.config.overlap != OverlapMode::Off).then(|| Predrafting {
                        counts: scope.predraft.clone(),
                        branches: self.config.predraft_branches,
                        overlap: self.overlap.clone(),
                        verifiers: verifiers.clone(),
                    }),
                );
                match &self.drafters {
                    Drafters::Hybrid { lookup, .. } => {
                        let hybrid = HybridDrafter::new(session, lookup.config())
                            .map_err(|e| Status::internal(e.to_string()))?;
                        self.round_loop(&verifier, Some(&hybrid))
                            .run_constrained(request(block), constraint, sink, control)
                            .await
                    }
                    _ => {
                        self.round_loop(&verifier, Some(&session))
                            .run_constrained(request(block), constraint, sink, control)
                            .await
                    }
                }
            }
        };
        result.map_err(remote_loop_status)
    }

    /// The request's sequence, to be placed on a verifier replica.
    fn sequence(
        &self,
        verifiers: &Arc<VerifierPool>,
        options: SequenceOptions,
        scope: &RequestScope,
    ) -> RemoteSequence {
        RemoteSequence::new(verifiers.clone(), options, scope.migrations.clone())
    }

    /// A drafter for a new session; the governor learns how many drafters the pool (which
    /// discovery may grow or shrink) now has.
    async fn pick_drafter(
        &self,
        pool: &DrafterPool,
        plan: &Plan,
        scope: &RequestScope,
    ) -> Option<Lease> {
        self.admission
            .governor()
            .set_drafter_parallelism(pool.size());
        let prefix = prefix_chain(scope.cache_scope.as_str(), &plan.prompt_ids);
        pool.pick_for(None, &[], &prefix).await
    }

    /// The round loop of a speculating request: drafts are checked against the target's
    /// vocabulary, so a drafter proposing other ids ends speculation, not the request.
    fn round_loop<'a, D: Drafter<Carry = WireCarry>>(
        &'a self,
        verifier: &'a RemoteSequence,
        drafter: Option<&'a D>,
    ) -> RoundLoop<'a, RemoteSequence, D, TargetText> {
        RoundLoop::new(verifier, drafter, &*self.text).with_vocab_size(self.limits.vocab_size)
    }

    /// `block` with rounds that may verify up to `tree_nodes` branch drafts where the target
    /// verifies trees; a tree's rows beside its deepest block stay within what the verifier
    /// takes in one round.
    fn with_trees(&self, block: BlockSizeConfig) -> BlockSizeConfig {
        if !self.limits.verifies_trees {
            return block;
        }
        let room = self.limits.max_block_size.saturating_sub(block.requested);
        block.with_tree_nodes(self.config.tree_nodes.min(room))
    }

    fn block_config(&self, choice: BlockChoice) -> BlockSizeConfig {
        let ceiling = self.config.block_ceiling(&self.limits);
        match choice {
            BlockChoice::Disabled => BlockSizeConfig::PLAIN,
            BlockChoice::Fixed(size) => BlockSizeConfig::fixed(size.min(ceiling)),
            BlockChoice::Adaptive => {
                BlockSizeConfig::adaptive(ceiling, self.config.block_size.min(ceiling))
            }
        }
    }
}

/// The public status of a failed request.
fn remote_loop_status(error: RoundLoopError<RemoteError>) -> Status {
    loop_status(error, |remote| remote.to_status())
}
