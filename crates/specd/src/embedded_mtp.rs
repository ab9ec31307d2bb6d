//! The Gemma 4 assistant (MTP engine) in this process: the verifier's hidden states and
//! shared K/V rows go to its mirror as they are, with no wire conversion.

use std::path::Path;

use candle_core::{DType, Device};
use specd_core::{DraftRequest, OpenRequest};
use specd_drafter::{CommittedKv, DraftCarry, EngineError, MtpEngine, SessionSource, SharedKv};
use specd_verifier::TargetCarry;

use crate::embedded_drafter::{EmbeddedDrafter, InProcessCarry};

pub fn load(
    drafter: &Path,
    target: &Path,
    dtype: DType,
    device: &Device,
) -> Result<EmbeddedDrafter<MtpEngine>, EngineError> {
    Ok(EmbeddedDrafter::new(MtpEngine::load(
        drafter, target, dtype, device,
    )?))
}

fn shared_kv(carry: &TargetCarry) -> Result<&SharedKv, EngineError> {
    carry
        .shared_kv
        .as_ref()
        .ok_or_else(|| EngineError::invalid("carry", "the target exports no shared K/V"))
}

impl InProcessCarry for MtpEngine {
    fn open_from(
        &self,
        request: &OpenRequest<TargetCarry>,
    ) -> Result<(SessionSource, Vec<DraftCarry>), EngineError> {
        let shared = shared_kv(&request.carry)?.clone();
        let first = DraftCarry::Mtp {
            hidden: request.carry.hidden.clone(),
            delta: None,
        };
        Ok((SessionSource::Snapshot(shared), vec![first]))
    }

    fn carries_of(
        &self,
        request: &DraftRequest<TargetCarry>,
    ) -> Result<Vec<DraftCarry>, EngineError> {
        request
            .carries
            .iter()
            .map(|carry| {
                let delta = CommittedKv {
                    rows: shared_kv(carry)?.clone(),
                    // The assistant's mirror keeps its own window of sliding rows.
                    sliding_evicted: 0,
                };
                Ok(DraftCarry::Mtp {
                    hidden: carry.hidden.clone(),
                    delta: Some(delta),
                })
            })
            .collect()
    }
}
