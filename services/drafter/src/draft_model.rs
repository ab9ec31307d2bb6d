//! The `draft-model` kind: an independent small LM (any [`CausalLm`]; a Qwen2 GGUF from the
//! command line) with its own KV cache per session. Each round ships only the committed tokens; the cache keeps what the drafter fed
//! last round where it agrees with them and is rolled back past the first rejection.

use std::path::Path;

use candle_core::Device;
use specd_models::qwen2::{LoadOptions, Qwen2Model};
use specd_models::{CausalLm, OutputRows, SeqBlock};
use specd_wire::drafter::DrafterKind;

use crate::engine::{
    DraftCarry, DraftEngine, DraftStep, EngineError, EngineInfo, OpenSession, SessionSource,
};

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
}

pub struct DraftModelSession<C = specd_models::qwen2::KvCache> {
    cache: C,
    /// Tokens in the target cache.
    committed_len: usize,
    /// Committed tokens not yet in the drafter's cache.
    pending: Vec<u32>,
    /// Tokens the drafter fed after `committed_len` last round (the bonus and its drafts,
    /// then what the pre-draft fed).
    speculated: Vec<u32>,
    /// The last draft, not fed yet: where a pre-draft starts.
    last_draft: Option<u32>,
    /// Tokens pre-drafted for the next round: the drafter's guess of the target's next
    /// token, then drafts after it; all but the last are fed.
    predraft: Vec<u32>,
    /// The last draft started from the pre-draft.
    predraft_hit: bool,
}

fn internal(e: impl std::fmt::Display) -> EngineError {
    EngineError::Internal(e.to_string())
}

impl DraftModelEngine<Qwen2Model> {
    /// Loads a GGUF draft model.
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
        Ok(Self::new(model, name, max_draft_tokens))
    }
}

impl<M: CausalLm> DraftModelEngine<M> {
    pub fn new(model: M, name: String, max_draft_tokens: usize) -> Self {
        let draft_vocab = DEFAULT_DRAFT_VOCAB.min(model.vocab_size());
        Self {
            model,
            name,
            max_draft_tokens,
            draft_vocab,
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

    /// The greedy token among the draft vocabulary after `tokens` (on CPU the logits are
    /// never materialised, and the head's rows past the draft vocabulary never read).
    fn next_token(&self, tokens: &[u32], cache: &mut M::Cache) -> Result<u32, EngineError> {
        let mut rows = [SeqBlock { cache, tokens }];
        let last = self
            .model
            .forward(&mut rows, OutputRows::Last)
            .map_err(internal)?
            .pop()
            .ok_or_else(|| EngineError::Internal("the draft model returned no row".into()))?;
        let best = self
            .model
            .argmax_below(&last, self.draft_vocab)
            .map_err(internal)?;
        best.first()
            .copied()
            .ok_or_else(|| EngineError::Internal("the draft model returned no token".into()))
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
        let mut cache = self.model.new_cache(0).map_err(internal)?;
        for piece in tokens.chunks(self.model.default_prefill_chunk().max(1)) {
            let mut rows = [SeqBlock {
                cache: &mut cache,
                tokens: piece,
            }];
            self.model
                .forward(&mut rows, OutputRows::None)
                .map_err(internal)?;
        }
        Ok(DraftModelSession {
            cache,
            committed_len: open.committed_len,
            pending: Vec::new(),
            speculated: Vec::new(),
            last_draft: None,
            predraft: Vec::new(),
            predraft_hit: false,
        })
    }

    fn committed_len(&self, session: &Self::Session) -> usize {
        session.committed_len
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
        session.last_draft = None;
        session.committed_len += committed.len();
        if agree == committed.len() && !session.predraft.is_empty() {
            // Every draft was accepted: what the pre-draft fed stays, for the next draft.
            session.speculated.drain(..agree);
            return Ok(());
        }
        session.predraft.clear();
        self.model
            .truncate(&mut session.cache, speculated_from + agree)
            .map_err(internal)?;
        session.pending.extend_from_slice(&committed[agree..]);
        session.speculated.clear();
        Ok(())
    }

    fn draft(&self, session: &mut Self::Session, step: DraftStep) -> Result<Vec<u32>, EngineError> {
        let vocab = self.model.vocab_size();
        if step.bonus as usize >= vocab {
            return Err(EngineError::invalid(
                "draft.bonus",
                format!("token id {} is not below {vocab}", step.bonus),
            ));
        }
        let predraft = std::mem::take(&mut session.predraft);
        session.predraft_hit = session.pending.is_empty() && predraft.first() == Some(&step.bonus);
        // On a hit the pre-drafted tokens after the bonus are this round's first drafts.
        let mut drafts: Vec<u32> = if session.predraft_hit {
            predraft.into_iter().skip(1).take(step.count).collect()
        } else {
            Vec::new()
        };
        if session.pending.is_empty() {
            // The cache holds the committed tokens and whatever a pre-draft fed after them
            // (the bonus and the pre-drafted tokens but the last); keep what drafting the
            // reused drafts would have fed: the bonus and all of them but the last.
            self.model
                .truncate(&mut session.cache, session.committed_len + drafts.len())
                .map_err(internal)?;
        }
        if drafts.is_empty() {
            let mut feed = std::mem::take(&mut session.pending);
            feed.push(step.bonus);
            drafts.push(self.next_token(&feed, &mut session.cache)?);
        }
        session.speculated = std::iter::once(step.bonus)
            .chain(drafts.iter().copied())
            .take(drafts.len())
            .collect();
        while drafts.len() < step.count {
            let last = drafts[drafts.len() - 1];
            let next = self.next_token(&[last], &mut session.cache)?;
            session.speculated.push(last);
            drafts.push(next);
        }
        session.last_draft = drafts.last().copied();
        Ok(drafts)
    }

    fn predraft_step(
        &self,
        session: &mut Self::Session,
        count: usize,
    ) -> Result<bool, EngineError> {
        if session.predraft.len() > count {
            return Ok(false);
        }
        let Some(feed) = session.predraft.last().copied().or(session.last_draft) else {
            return Ok(false);
        };
        let next = self.next_token(&[feed], &mut session.cache)?;
        session.speculated.push(feed);
        session.predraft.push(next);
        Ok(true)
    }

    fn predraft_hit(&self, session: &Self::Session) -> bool {
        session.predraft_hit
    }
}
