//! The Gemma 4 assistant (MTP engine) in this process: the verifier's hidden states and
//! shared K/V rows go to its mirror directly.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use specd_core::{DraftRequest, OpenRequest};
use specd_drafter::{DraftCarry, EngineError, MtpEngine, SessionSource};
use specd_models::gemma4::{LayerKv, SharedKv};
use specd_verifier::TargetCarry;
use specd_wire::kv::{KvDeltaTensors, KvPair, KvSnapshot};

use crate::embedded_drafter::{EmbeddedDrafter, InProcessCarry};

pub fn load(
    drafter_dir: &Path,
    target_dir: &Path,
    dtype: DType,
    device: &Device,
) -> Result<EmbeddedDrafter<MtpEngine>, EngineError> {
    Ok(EmbeddedDrafter::new(MtpEngine::load(
        drafter_dir,
        target_dir,
        dtype,
        device,
    )?))
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

impl InProcessCarry for MtpEngine {
    fn open_from(
        &self,
        request: &OpenRequest<TargetCarry>,
    ) -> Result<(SessionSource, Vec<DraftCarry>), EngineError> {
        let shared = shared_kv(&request.carry)?;
        let snapshot = KvSnapshot {
            committed_len: position(request.carry.committed_len, "committed_len")?,
            sliding_start: match &shared.sliding {
                Some(sliding) => position(sliding.start, "sliding_start")?,
                None => 0,
            },
            full: pair(&shared.full)?,
            sliding: shared.sliding.as_ref().map(pair).transpose()?,
        };
        let first = DraftCarry::Mtp {
            hidden: hidden(&request.carry)?,
            delta: None,
        };
        Ok((SessionSource::Snapshot(snapshot), vec![first]))
    }

    fn carries_of(
        &self,
        request: &DraftRequest<TargetCarry>,
    ) -> Result<Vec<DraftCarry>, EngineError> {
        request
            .carries
            .iter()
            .map(|carry| {
                let rows = shared_kv(carry)?;
                let start = carry.committed_len - rows.full.rows();
                let delta = KvDeltaTensors {
                    start_position: position(start, "start_position")?,
                    full: pair(&rows.full)?,
                    sliding: rows.sliding.as_ref().map(pair).transpose()?,
                    // The assistant's mirror keeps its own window of sliding rows.
                    sliding_evicted: 0,
                };
                Ok(DraftCarry::Mtp {
                    hidden: hidden(carry)?,
                    delta: Some(delta),
                })
            })
            .collect()
    }
}
