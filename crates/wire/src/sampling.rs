//! Sampling parameters from the wire, validated: the one conversion the verifier and drafter
//! servers share.

use crate::Sampling;
use specd_core::SamplingParams;
use tonic::Status;

/// The sequence's sampling: greedy when unset; a `top_p` of 0 means 1 (see `sampling.proto`).
/// Out-of-range values are INVALID_ARGUMENT naming `sampling.<field>`.
pub fn sampling_from_wire(wire: Option<&Sampling>) -> Result<SamplingParams, Status> {
    let Some(wire) = wire else {
        return Ok(SamplingParams::GREEDY);
    };
    let params = SamplingParams {
        temperature: wire.temperature,
        top_p: if wire.top_p == 0.0 { 1.0 } else { wire.top_p },
        top_k: wire.top_k,
        seed: wire.seed,
    };
    params.validate().map_err(|error| {
        Status::invalid_argument(format!("sampling.{}: {}", error.field, error.reason))
    })?;
    Ok(params)
}
