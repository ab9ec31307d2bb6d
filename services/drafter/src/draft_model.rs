//! The `draft-model` kind: an independent small LM (a Qwen2 GGUF) with its own KV cache per
//! session. Each round ships only the committed tokens; the cache keeps what the drafter fed
//! last round where it agrees with them and is rolled back past the first rejection.

use std::path::Path;

use candle_core::Device;
use specd_models::qwen2::{KvCache, LoadOptions, Qwen2Model};
use specd_wire::drafter::DrafterKind;

use crate::engine::{
    DraftCarry, DraftEngine, DraftStep, EngineError, EngineInfo, OpenSession, SessionSource,
};

/// Prompt tokens fed to the drafter per forward when a session opens.
const PREFILL_CHUNK: usize = 256;

pub struct DraftModelEngine {
    model: Qwen2Model,
    name: String,
    max_draft_tokens: usize,
}

pub struct DraftModelSession {
    cache: KvCache,
    /// Tokens in the target cache.
    committed_len: usize,
    /// Committed tokens not yet in the drafter's cache.
    pending: Vec<u32>,
    /// Tokens the drafter fed after `committed_len` last round (the bonus and its drafts).
    speculated: Vec<u32>,
}

fn internal(e: impl std::fmt::Display) -> EngineError {
    EngineError::Internal(e.to_string())
}

impl DraftModelEngine {
    pub fn load(
        path: &Path,
        device: &Device,
        max_draft_tokens: usize,
    ) -> Result<Self, EngineError> {
        let model =
            Qwen2Model::load_with(path, device, &LoadOptions::default()).map_err(internal)?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Self {
            model,
            name,
            max_draft_tokens,
        })
    }

    pub fn model(&self) -> &Qwen2Model {
        &self.model
    }

    /// The greedy token after `tokens` (on CPU the logits are never materialised).
    fn next_token(&self, tokens: &[u32], cache: &mut KvCache) -> Result<u32, EngineError> {
        self.model
            .forward_block_argmax(tokens, cache)
            .map_err(internal)
    }
}

impl DraftEngine for DraftModelEngine {
    type Session = DraftModelSession;

    fn info(&self) -> EngineInfo {
        EngineInfo {
            kind: DrafterKind::DraftModel,
            model: self.name.clone(),
            max_draft_tokens: self.max_draft_tokens,
            vocab_size: self.model.config().vocab_size,
        }
    }

    fn device(&self) -> &Device {
        self.model.device()
    }

    fn open(&self, open: OpenSession) -> Result<DraftModelSession, EngineError> {
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
        let vocab = self.model.config().vocab_size;
        if let Some(i) = tokens.iter().position(|&t| t as usize >= vocab) {
            return Err(EngineError::invalid(
                &format!("open.context_ids[{i}]"),
                format!("token id {} is not below {vocab}", tokens[i]),
            ));
        }
        let mut cache = self.model.new_cache().map_err(internal)?;
        for piece in tokens.chunks(PREFILL_CHUNK) {
            self.model
                .forward_block_hidden(piece, &mut cache)
                .map_err(internal)?;
        }
        Ok(DraftModelSession {
            cache,
            committed_len: open.committed_len,
            pending: Vec::new(),
            speculated: Vec::new(),
        })
    }

    fn committed_len(&self, session: &DraftModelSession) -> usize {
        session.committed_len
    }

    fn apply(&self, session: &mut DraftModelSession, carry: DraftCarry) -> Result<(), EngineError> {
        let DraftCarry::Tokens(committed) = carry else {
            return Err(EngineError::invalid(
                "draft.carry",
                "a draft model takes the committed tokens",
            ));
        };
        if committed.is_empty() {
            return Ok(());
        }
        // What the drafter fed last round stays valid up to the first token the target did not commit.
        let cached = session.cache.len();
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
        session
            .cache
            .truncate(speculated_from + agree)
            .map_err(internal)?;
        session.pending.extend_from_slice(&committed[agree..]);
        session.speculated.clear();
        session.committed_len += committed.len();
        Ok(())
    }

    fn draft(
        &self,
        session: &mut DraftModelSession,
        step: DraftStep,
    ) -> Result<Vec<u32>, EngineError> {
        let vocab = self.model.config().vocab_size;
        if step.bonus as usize >= vocab {
            return Err(EngineError::invalid(
                "draft.bonus",
                format!("token id {} is not below {vocab}", step.bonus),
            ));
        }
        let mut feed = std::mem::take(&mut session.pending);
        feed.push(step.bonus);
        let mut drafts = Vec::with_capacity(step.count);
        let mut next = self.next_token(&feed, &mut session.cache)?;
        session.speculated = vec![step.bonus];
        drafts.push(next);
        while drafts.len() < step.count {
            next = self.next_token(&[next], &mut session.cache)?;
            session.speculated.push(drafts[drafts.len() - 1]);
            drafts.push(next);
        }
        Ok(drafts)
    }
}
