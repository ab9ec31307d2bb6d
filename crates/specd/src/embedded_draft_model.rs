//! The draft-model engine in this process: each round hands it the committed tokens.

use specd_core::{DraftRequest, OpenRequest};
use specd_drafter::{DraftCarry, DraftEngine, DraftModelEngine, EngineError, SessionSource};
use specd_models::{AnyLm, CausalLm, LoadSpec, ModelSource};
use specd_verifier::TargetCarry;

use crate::embedded_drafter::{EmbeddedDrafter, InProcessCarry};

/// Loads a draft model (of any family the registry lets draft as one) and refuses it unless
/// its vocabulary is the target's; see [`with_target`].
pub fn load(
    source: &ModelSource,
    spec: &LoadSpec<'_>,
    target_vocab: usize,
    draft_vocab: usize,
    prefix_cache_bytes: usize,
) -> Result<EmbeddedDrafter<DraftModelEngine<AnyLm>>, EngineError> {
    let engine = DraftModelEngine::load(source, spec, 16)?;
    with_target(engine, target_vocab, draft_vocab, prefix_cache_bytes)
}

/// A draft model in this process, refused unless its vocabulary is the target's: it proposes
/// ids below `draft_vocab` only (0: every id), and keeps `prefix_cache_bytes` of closed
/// sessions' K/V for later ones.
pub fn with_target<M: CausalLm>(
    engine: DraftModelEngine<M>,
    target_vocab: usize,
    draft_vocab: usize,
    prefix_cache_bytes: usize,
) -> Result<EmbeddedDrafter<DraftModelEngine<M>>, EngineError> {
    let engine = engine
        .with_draft_vocab(draft_vocab)
        .with_prefix_cache(prefix_cache_bytes);
    let vocab = engine.info().vocab_size;
    if vocab != target_vocab {
        return Err(EngineError::invalid(
            "drafter",
            format!("the draft model's vocabulary has {vocab} tokens, the target's {target_vocab}"),
        ));
    }
    Ok(EmbeddedDrafter::new(engine))
}

impl<M: CausalLm> InProcessCarry for DraftModelEngine<M> {
    fn open_from(
        &self,
        request: &OpenRequest<TargetCarry>,
    ) -> Result<(SessionSource, Vec<DraftCarry>), EngineError> {
        Ok((
            SessionSource::Context(request.prompt_ids.clone()),
            Vec::new(),
        ))
    }

    fn carries_of(
        &self,
        request: &DraftRequest<TargetCarry>,
    ) -> Result<Vec<DraftCarry>, EngineError> {
        Ok(vec![DraftCarry::Tokens(request.committed_tokens.clone())])
    }
}
