//! An adversarial engine: it follows the protocol exactly (mirrors the shared K/V, tracks the
//! committed tokens) but proposes uniformly random token ids. Lossless decoding must give
//! the same output with it as without drafting, and it bounds the worst case in benchmarks.

use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{Device, Tensor};
use specd_core::sampling::{keyed_u64, mix64};
use specd_wire::drafter::DrafterKind;

use specd_drafter::{
    DraftCarry, DraftEngine, DraftStep, EngineError, EngineInfo, OpenSession, SessionSource,
};

use super::mirror::KvMirror;

/// Uniformly random drafts over a vocabulary, for either carry kind.
pub struct RandomDrafts {
    kind: DrafterKind,
    vocab_size: usize,
    max_draft_tokens: usize,
    seed: u64,
    sessions_opened: AtomicU64,
    device: Device,
}

/// What a random session tracks: exactly what a real engine of its kind would receive.
pub enum RandomSession {
    Mtp {
        mirror: KvMirror,
        hidden: Option<Tensor>,
        key: u64,
    },
    Tokens {
        tokens: Vec<u32>,
        key: u64,
    },
}

impl RandomDrafts {
    /// An engine of `kind` (MTP or draft model) drafting ids below `vocab_size`.
    pub fn new(kind: DrafterKind, vocab_size: usize, max_draft_tokens: usize, seed: u64) -> Self {
        Self {
            kind,
            vocab_size: vocab_size.max(1),
            max_draft_tokens,
            seed,
            sessions_opened: AtomicU64::new(0),
            device: Device::Cpu,
        }
    }
}

impl DraftEngine for RandomDrafts {
    type Session = RandomSession;

    fn info(&self) -> EngineInfo {
        EngineInfo {
            kind: self.kind,
            model: "random".to_owned(),
            max_draft_tokens: self.max_draft_tokens,
            vocab_size: self.vocab_size,
        }
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn open(&self, open: OpenSession) -> Result<RandomSession, EngineError> {
        let key = mix64(self.seed ^ self.sessions_opened.fetch_add(1, Ordering::Relaxed));
        Ok(match open.source {
            SessionSource::Snapshot(snapshot) => RandomSession::Mtp {
                mirror: KvMirror::from_snapshot(snapshot),
                hidden: None,
                key,
            },
            SessionSource::Context(tokens) => RandomSession::Tokens { tokens, key },
        })
    }

    fn committed_len(&self, session: &RandomSession) -> usize {
        match session {
            RandomSession::Mtp { mirror, .. } => mirror.committed_len(),
            RandomSession::Tokens { tokens, .. } => tokens.len(),
        }
    }

    fn apply(&self, session: &mut RandomSession, carry: DraftCarry) -> Result<(), EngineError> {
        match (session, carry) {
            (
                RandomSession::Mtp { mirror, hidden, .. },
                DraftCarry::Mtp {
                    hidden: new_hidden,
                    delta,
                },
            ) => {
                if let Some(delta) = &delta {
                    mirror.apply(delta)?;
                }
                *hidden = Some(new_hidden);
                Ok(())
            }
            (RandomSession::Tokens { tokens, .. }, DraftCarry::Tokens(committed)) => {
                tokens.extend_from_slice(&committed);
                Ok(())
            }
            _ => Err(EngineError::invalid(
                "carry",
                "the carry kind does not match the session",
            )),
        }
    }

    fn draft(&self, session: &mut RandomSession, step: DraftStep) -> Result<Vec<u32>, EngineError> {
        let key = match session {
            RandomSession::Mtp { hidden: None, .. } => {
                return Err(EngineError::mismatch(
                    "carry.mtp.hidden",
                    "no hidden state was ever applied to this session",
                ))
            }
            RandomSession::Mtp { key, .. } | RandomSession::Tokens { key, .. } => *key,
        };
        let vocab = self.vocab_size as u64;
        Ok((0..step.count as u64)
            .map(|i| (keyed_u64(key, step.output_index_base + i) % vocab) as u32)
            .collect())
    }
}
