//! Sampling parameters in their wire form.

use specd_core::SamplingParams;
use specd_wire::Sampling;

/// The resolved sampling of a sequence, as the verifier and drafters receive it.
pub fn sampling_to_wire(params: &SamplingParams) -> Sampling {
    Sampling {
        temperature: params.temperature,
        top_p: params.top_p,
        top_k: params.top_k,
        seed: params.seed,
    }
}
