//! An independent small LM as an in-process drafter for `specd generate`: the draft-model
//! engine of the drafter service, fed the committed tokens directly instead of over gRPC.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use candle_core::Device;
use specd_core::{DraftRequest, Drafter, OpenRequest, SessionId};
use specd_drafter::{
    DraftCarry, DraftEngine, DraftModelEngine, DraftModelSession, DraftStep, EngineError,
    OpenSession, SessionSource,
};
use specd_verifier::TargetCarry;

pub struct EmbeddedDraftModel {
    engine: DraftModelEngine,
    sessions: Mutex<HashMap<SessionId, DraftModelSession>>,
}

impl EmbeddedDraftModel {
    /// Loads the drafter and refuses it unless its vocabulary is the target's.
    pub fn load(path: &Path, device: &Device, target_vocab: usize) -> Result<Self, EngineError> {
        let engine = DraftModelEngine::load(path, device, 16)?;
        let vocab = engine.info().vocab_size;
        if vocab != target_vocab {
            return Err(EngineError::invalid(
                "drafter",
                format!(
                    "the draft model's vocabulary has {vocab} tokens, the target's {target_vocab}"
                ),
            ));
        }
        Ok(Self {
            engine,
            sessions: Mutex::default(),
        })
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<SessionId, DraftModelSession>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn draft_now(&self, request: DraftRequest<TargetCarry>) -> Result<Vec<u32>, EngineError> {
        let mut sessions = self.sessions();
        let session = sessions
            .get_mut(&request.session)
            .ok_or_else(|| EngineError::mismatch("session", "not open"))?;
        self.engine
            .apply(session, DraftCarry::Tokens(request.committed_tokens))?;
        let held = self.engine.committed_len(session);
        if held != request.committed_len {
            return Err(EngineError::mismatch(
                "committed_len",
                format!(
                    "the session holds {held}, the round says {}",
                    request.committed_len
                ),
            ));
        }
        self.engine.draft(
            session,
            DraftStep {
                bonus: request.bonus,
                position: held - 1,
                count: request.count,
                output_index_base: request.output_index_base,
            },
        )
    }
}

impl Drafter for EmbeddedDraftModel {
    type Carry = TargetCarry;
    type Error = EngineError;

    async fn open(&self, request: OpenRequest<TargetCarry>) -> Result<(), EngineError> {
        let session = self.engine.open(OpenSession {
            sampling: request.sampling,
            committed_len: request.prompt_ids.len(),
            source: SessionSource::Context(request.prompt_ids),
        })?;
        self.sessions().insert(request.session, session);
        Ok(())
    }

    async fn draft(&self, request: DraftRequest<TargetCarry>) -> Result<Vec<u32>, EngineError> {
        self.draft_now(request)
    }

    async fn close(&self, session: SessionId) -> Result<(), EngineError> {
        self.sessions().remove(&session);
        Ok(())
    }

    fn close_detached(&self, session: SessionId) {
        self.sessions().remove(&session);
    }
}
