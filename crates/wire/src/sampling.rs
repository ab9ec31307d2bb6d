//! Sampling parameters from the wire, validated: the one conversion the verifier and drafter
//! servers share.

use crate::Sampling;
use specd_core::{LogitRules, SamplingParams, TokenLogprob, TokenMask};
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

/// The sequence's logit rules; unset: none. Out-of-range values are INVALID_ARGUMENT naming
/// `rules.<field>` (ids against the vocabulary are the verifier's to check).
pub fn rules_from_wire(wire: Option<&crate::LogitRules>) -> Result<LogitRules, Status> {
    let Some(wire) = wire else {
        return Ok(LogitRules::default());
    };
    let rules = LogitRules {
        presence_penalty: wire.presence_penalty,
        frequency_penalty: wire.frequency_penalty,
        repetition_penalty: wire.repetition_penalty,
        logit_bias: logit_bias_from_wire(&wire.logit_bias),
        min_p: wire.min_p,
    };
    rules.validate(None).map_err(|error| {
        Status::invalid_argument(format!("rules.{}: {}", error.field, error.reason))
    })?;
    Ok(rules)
}

/// A wire bias map as `(token, bias)` pairs in id order, so equal maps give equal rules.
pub fn logit_bias_from_wire(map: &std::collections::HashMap<u32, f32>) -> Vec<(u32, f32)> {
    let mut bias: Vec<(u32, f32)> = map.iter().map(|(&token, &bias)| (token, bias)).collect();
    bias.sort_by_key(|&(token, _)| token);
    bias
}

/// The rules on the wire; `None` when they change nothing.
pub fn rules_to_wire(rules: &LogitRules) -> Option<crate::LogitRules> {
    (!rules.is_neutral()).then(|| crate::LogitRules {
        presence_penalty: rules.presence_penalty,
        frequency_penalty: rules.frequency_penalty,
        repetition_penalty: rules.repetition_penalty,
        logit_bias: rules.logit_bias.iter().copied().collect(),
        min_p: rules.min_p,
    })
}

/// A token's log probability on the wire.
pub fn logprob_to_wire(logprob: &TokenLogprob) -> crate::TokenLogprob {
    crate::TokenLogprob {
        token: logprob.token,
        logprob: logprob.logprob,
        top: logprob
            .top
            .iter()
            .map(|&(token, logprob)| crate::TopLogprob { token, logprob })
            .collect(),
    }
}

/// A token's log probability from the wire.
pub fn logprob_from_wire(wire: &crate::TokenLogprob) -> TokenLogprob {
    TokenLogprob {
        token: wire.token,
        logprob: wire.logprob,
        top: wire.top.iter().map(|t| (t.token, t.logprob)).collect(),
    }
}

/// A mask as little-endian u32 words.
pub fn mask_to_wire(mask: &TokenMask) -> bytes::Bytes {
    let bytes: Vec<u8> = mask.words().iter().flat_map(|w| w.to_le_bytes()).collect();
    bytes.into()
}

/// A mask from its wire bytes; `field` names it in the INVALID_ARGUMENT of a length that is
/// not whole words.
pub fn mask_from_wire(bytes: &[u8], field: &str) -> Result<TokenMask, Status> {
    if !bytes.len().is_multiple_of(4) {
        return Err(Status::invalid_argument(format!(
            "{field}: {} bytes are not whole 32-bit words",
            bytes.len()
        )));
    }
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(TokenMask::from_words(words))
}
