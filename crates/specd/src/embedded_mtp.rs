//! The Gemma 4 assistant as an in-process drafter for `specd generate`: the MTP engine of the
//! drafter service, fed the verifier's carries directly instead of over gRPC.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use candle_core::{DType, Device, Tensor};
use specd_core::{DraftRequest, Drafter, OpenRequest, SessionId};
use specd_drafter::{
    DraftCarry, DraftEngine, DraftStep, EngineError, MtpEngine, MtpSession, OpenSession,
    SessionSource,
};
use specd_models::gemma4::{LayerKv, SharedKv};
use specd_verifier::TargetCarry;
use specd_wire::kv::{KvDeltaTensors, KvPair, KvSnapshot};

/// The MTP engine with its sessions, behind core's [`Drafter`].
pub struct EmbeddedMtp {
    engine: MtpEngine,
    sessions: Mutex<HashMap<SessionId, MtpSession>>,
}

/// Model rows `[heads, rows, dim]` in the `[1, heads, rows, dim]` layout the engine takes.
fn pair(layer: &LayerKv) -> Result<KvPair, EngineError> {
    Ok(KvPair {
        k: layer.keys.unsqueeze(0)?,
        v: layer.values.unsqueeze(0)?,
    })
}

fn shared_kv(carry: &TargetCarry) -> Result<&SharedKv, EngineError> {
    carry
        .shared_kv
        .as_ref()
        .ok_or_else(|| EngineError::invalid("carry", "the target exports no shared K/V"))
}

/// The target hidden `[1, H]` as `[1, 1, H]`.
fn hidden(carry: &TargetCarry) -> Result<Tensor, EngineError> {
    let width = carry.hidden.elem_count();
    Ok(carry.hidden.reshape((1, 1, width))?)
}

fn position(value: usize, field: &str) -> Result<u32, EngineError> {
    u32::try_from(value).map_err(|_| EngineError::invalid(field, "exceeds 32 bits"))
}

impl EmbeddedMtp {
    pub fn load(
        drafter_dir: &Path,
        target_dir: &Path,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, EngineError> {
        Ok(Self {
            engine: MtpEngine::load(drafter_dir, target_dir, dtype, device)?,
            sessions: Mutex::default(),
        })
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<SessionId, MtpSession>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn open_now(&self, request: OpenRequest<TargetCarry>) -> Result<(), EngineError> {
        let shared = shared_kv(&request.carry)?;
        let committed_len = request.carry.committed_len;
        let snapshot = KvSnapshot {
            committed_len: position(committed_len, "committed_len")?,
            sliding_start: match &shared.sliding {
                Some(sliding) => position(sliding.start, "sliding_start")?,
                None => 0,
            },
            full: pair(&shared.full)?,
            sliding: shared.sliding.as_ref().map(pair).transpose()?,
        };
        let mut session = self.engine.open(OpenSession {
            sampling: request.sampling,
            committed_len,
            source: SessionSource::Snapshot(snapshot),
        })?;
        let first = DraftCarry::Mtp {
            hidden: hidden(&request.carry)?,
            delta: None,
        };
        self.engine.apply(&mut session, first)?;
        self.sessions().insert(request.session, session);
        Ok(())
    }

    fn draft_now(&self, request: DraftRequest<TargetCarry>) -> Result<Vec<u32>, EngineError> {
        let mut sessions = self.sessions();
        let session = sessions
            .get_mut(&request.session)
            .ok_or_else(|| EngineError::mismatch("session", "not open"))?;
        for carry in &request.carries {
            let rows = shared_kv(carry)?;
            let start = carry.committed_len - rows.full.rows();
            let delta = KvDeltaTensors {
                start_position: position(start, "start_position")?,
                full: pair(&rows.full)?,
                sliding: rows.sliding.as_ref().map(pair).transpose()?,
                // The assistant's mirror keeps its own window of sliding rows.
                sliding_evicted: 0,
            };
            let step = DraftCarry::Mtp {
                hidden: hidden(carry)?,
                delta: Some(delta),
            };
            self.engine.apply(session, step)?;
        }
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

impl Drafter for EmbeddedMtp {
    type Carry = TargetCarry;
    type Error = EngineError;

    async fn open(&self, request: OpenRequest<TargetCarry>) -> Result<(), EngineError> {
        self.open_now(request)
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
