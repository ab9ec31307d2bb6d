//! The MTP engine: the Gemma 4 assistant drafting from a per-session mirror of the target's
//! shared K/V and the target's last hidden state.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use specd_core::{sample, DraftTree, SamplingParams};
use specd_models::gemma4_assistant::{first_argmax, Gemma4Assistant, SharedKvMirror};
use specd_models::{top_two_with, TopTwo};
use specd_wire::drafter::DrafterKind;

use crate::engine::{
    DraftCarry, DraftEngine, DraftStep, EngineError, EngineInfo, OpenSession, SessionSource,
};
use crate::tree_growth::{grow, Branching, Calibration, RunTree};

/// Drafts one session may ask for at most; the router's block size stays below it.
pub const MTP_MAX_DRAFT_TOKENS: usize = 16;

/// The Gemma 4 assistant as a drafter engine.
pub struct MtpEngine {
    model: Gemma4Assistant,
    name: String,
}

/// A session: the assistant's mirror, the last target hidden state and the sampling.
pub struct MtpSession {
    mirror: SharedKvMirror,
    hidden: Option<Tensor>,
    sampling: SamplingParams,
}

impl MtpSession {
    /// The target's hidden state the next draft starts from.
    fn hidden(&self) -> Result<&Tensor, EngineError> {
        self.hidden.as_ref().ok_or_else(|| {
            EngineError::mismatch(
                "carry.mtp.hidden",
                "no hidden state was ever applied to this session",
            )
        })
    }
}

impl MtpEngine {
    /// Loads the assistant at `drafter` and the token embedding of its target at `target`
    /// (each a checkpoint directory or a GGUF file).
    pub fn load(
        drafter: &Path,
        target: &Path,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, EngineError> {
        let model = Gemma4Assistant::load(drafter, target, dtype, device)
            .map_err(|e| EngineError::Internal(format!("loading the assistant: {e}")))?;
        let name = drafter
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Self { model, name })
    }

    /// The block size the checkpoint was trained for, when it says.
    pub fn trained_block_size(&self) -> Option<usize> {
        self.model.config().block_size
    }
}

/// The token drawn from `logits` with the target's key for output index `index` (the
/// argmax where the sampling cannot draw).
fn keyed_draw(logits: &[f32], sampling: &SamplingParams, index: u64) -> u32 {
    sample(logits, sampling, index)
        .ok()
        .or_else(|| first_argmax(logits))
        .unwrap_or(0)
}

impl MtpEngine {
    /// A tree node's two proposals for its children, at output index `index`, with their
    /// logits: for a greedy session the assistant's best two; for a sampled one the draft
    /// drawn with the target's key there (what the session's chain holds) and the likeliest
    /// other token.
    fn proposals(
        &self,
        sampling: &SamplingParams,
        normed: &Tensor,
        index: u64,
    ) -> Result<TopTwo, specd_models::ModelError> {
        if sampling.is_greedy() {
            return self.model.top_two(normed);
        }
        let logits = self.model.logits(normed)?;
        Ok(top_two_with(keyed_draw(&logits, sampling, index), &logits))
    }
}

fn model_error(field: &str) -> impl Fn(specd_models::ModelError) -> EngineError + '_ {
    move |e| EngineError::invalid(field, e.to_string())
}

impl DraftEngine for MtpEngine {
    type Session = MtpSession;

    fn info(&self) -> EngineInfo {
        EngineInfo {
            kind: DrafterKind::Mtp,
            model: self.name.clone(),
            max_draft_tokens: MTP_MAX_DRAFT_TOKENS,
            vocab_size: self.model.vocab_size(),
        }
    }

    fn device(&self) -> &Device {
        self.model.device()
    }

    fn open(&self, open: OpenSession) -> Result<MtpSession, EngineError> {
        let SessionSource::Snapshot(shared) = open.source else {
            return Err(EngineError::invalid(
                "header.context_ids",
                "an MTP drafter opens from a snapshot",
            ));
        };
        let mirror = self
            .model
            .new_mirror(&shared)
            .map_err(model_error("open.snapshot"))?;
        Ok(MtpSession {
            mirror,
            hidden: None,
            sampling: open.sampling,
        })
    }

    fn committed_len(&self, session: &MtpSession) -> usize {
        session.mirror.committed_len()
    }

    fn apply(&self, session: &mut MtpSession, carry: DraftCarry) -> Result<(), EngineError> {
        let DraftCarry::Mtp { hidden, delta } = carry else {
            return Err(EngineError::invalid(
                "carry",
                "an MTP drafter takes MTP carries",
            ));
        };
        // The mirror keeps its own sliding window, so the verifier's eviction count is not
        // needed.
        if let Some(delta) = delta {
            session
                .mirror
                .apply_delta(&delta.rows)
                .map_err(model_error("carry.mtp.delta"))?;
        }
        let width = hidden.elem_count();
        session.hidden = Some(hidden.reshape((1, width))?);
        Ok(())
    }

    fn draft(&self, session: &mut MtpSession, step: DraftStep) -> Result<Vec<u32>, EngineError> {
        let hidden = session.hidden()?;
        let drafts = if session.sampling.is_greedy() {
            self.model
                .draft_greedy(&session.mirror, step.bonus, hidden, step.count)
        } else {
            // Draft i is drawn with the target's key for its output index, so a draft that
            // agrees with the target's distribution tends to be the very token the target
            // draws there.
            let sampling = session.sampling;
            self.model.draft_sampled(
                &session.mirror,
                step.bonus,
                hidden,
                step.count,
                |logits, i| keyed_draw(logits, &sampling, step.output_index_base + i as u64),
            )
        };
        drafts.map_err(model_error("draft"))
    }

    /// A tree ([`crate::tree_growth`]): each node is one assistant step after its parent's
    /// (the assistant reads only the target's K/V, so a node depends on its parent's hidden
    /// state and its own token alone), and proposes its first and second choice
    /// ([`MtpEngine::proposals`]), so the path of first choices is the chain
    /// [`DraftEngine::draft`] gives, greedy or drawn with the target's key.
    fn draft_tree(
        &self,
        session: &mut MtpSession,
        step: DraftStep,
        branching: Branching,
    ) -> Result<DraftTree, EngineError> {
        if branching.nodes == 0 || step.count < 1 {
            return self.draft(session, step).map(DraftTree::chain);
        }
        let sampling = session.sampling;
        let proposals = |normed: &Tensor, depth: u64| {
            self.proposals(&sampling, normed, step.output_index_base + depth)
        };
        let hidden = session.hidden()?;
        let steps = self
            .model
            .block_steps(&session.mirror)
            .map_err(model_error("draft"))?;
        let root = steps
            .step(step.bonus, hidden)
            .map_err(model_error("draft.bonus"))?;
        let root_ranked = proposals(&root.normed, 0).map_err(model_error("draft"))?;
        // The hidden state each run node hands its children, and its depth, by node.
        let mut hiddens = vec![root.hidden];
        let mut depths = vec![0u64];
        // The session sees no committed tokens (only the target's K/V), so it keeps the
        // assistant's own shares.
        let grown = grow(
            step.bonus,
            &root_ranked,
            step.count,
            branching,
            &Calibration::default(),
            |ran: &RunTree, from| {
                (from..ran.tokens.len())
                    .map(|node| {
                        let parent = ran.parents[node - 1] as usize;
                        let out = steps.step(ran.tokens[node], &hiddens[parent])?;
                        hiddens.push(out.hidden);
                        let depth = depths[parent] + 1;
                        depths.push(depth);
                        proposals(&out.normed, depth)
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(model_error("draft"))
            },
        )?;
        Ok(grown.tree)
    }
}
